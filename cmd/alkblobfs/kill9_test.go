//go:build linux

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKill9Loop kills the daemon with SIGKILL while three publishers write
// into one namespace's incoming/ and two loops stat and list it, then
// mounts again at once. Every round must end: the killed daemon exits (no
// thread left stuck in the kernel behind a LOOKUP that waits for it), the
// next mount recovers the dead mountpoint (its daemon's recorded pid is
// gone), and at the end every file whose
// close returned 0 is published and verifies, with no stage file left.
// 3 rounds here, 20 under ALKBLOBFS_LONG=1.
//
// The test never touches the mount from its own process: a hung mount
// would hang it. If a round hangs anyway, it aborts the connection through
// fusectl so that the machine recovers, and fails.
func TestKill9Loop(t *testing.T) {
	requireFUSE(t)
	rounds := 3
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		rounds = 20
	}
	c := newCLI(t)
	c.ok("ns", "create", "p")
	mnt := t.TempDir()
	logs := t.TempDir()
	r := rand.New(rand.NewPCG(9, 9))
	for round := range rounds {
		dm := startDaemon(t, c.data, mnt)
		var procs []*exec.Cmd
		for w := range 3 {
			// Each copy whose close returned 0 is logged (outside the
			// mount). cp, not a shell redirection: the shell restores its
			// stdout with dup2, which drops the close's error.
			tmp := filepath.Join(logs, fmt.Sprintf("src-%d-%d", round, w))
			script := fmt.Sprintf(`i=0; while :; do i=$((i+1)); printf 'round %d writer %d file %%d' $i > %s && cp %s %s/p/incoming/w%d-$i && echo $i >> %s/r%d-w%d; done`,
				round, w, tmp, tmp, mnt, w, logs, round, w)
			procs = append(procs, exec.Command("sh", "-c", script))
		}
		for range 2 {
			script := fmt.Sprintf(`while :; do stat %s/p/incoming >/dev/null 2>&1; ls %s/p >/dev/null 2>&1; stat %s/p/%s >/dev/null 2>&1; done`,
				mnt, mnt, mnt, strings.Repeat("0", 64))
			procs = append(procs, exec.Command("sh", "-c", script))
		}
		for _, p := range procs {
			p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed as a group below
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Duration(100+r.IntN(800)) * time.Millisecond)
		dm.cmd.Process.Kill()
		select {
		case <-dm.done:
		case <-time.After(15 * time.Second):
			abortFUSE(t, mnt)
			t.Fatalf("round %d: the killed daemon did not exit within 15s: a thread is stuck in the kernel", round)
		}
		for _, p := range procs {
			syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
		}
		waited := make(chan struct{})
		go func() {
			for _, p := range procs {
				p.Wait()
			}
			close(waited)
		}()
		select {
		case <-waited:
		case <-time.After(15 * time.Second):
			abortFUSE(t, mnt)
			t.Fatalf("round %d: clients of the killed mount stuck", round)
		}
	}
	// The recovery mount cleans up; its start-up removes stage files.
	dm := startDaemon(t, c.data, mnt)
	listed := lines(c.ok("ls", "p"))
	published := 0
	for round := range rounds {
		for w := range 3 {
			b, err := os.ReadFile(filepath.Join(logs, fmt.Sprintf("r%d-w%d", round, w)))
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, i := range lines(string(b)) {
				d := sum([]byte(fmt.Sprintf("round %d writer %d file %s", round, w, i)))
				if !slices.Contains(listed, d) {
					t.Errorf("round %d writer %d file %s: close returned 0 but %s is not published", round, w, i, d)
				}
				published++
			}
		}
	}
	if published == 0 {
		t.Fatal("no file was published: the publishers never ran")
	}
	c.ok("verify") // every blob re-hashed
	stage, _ := os.ReadDir(filepath.Join(c.data, "large", "stage"))
	if len(stage) > 0 {
		t.Errorf("%d stage files survived start-up", len(stage))
	}
	t.Logf("%d rounds, %d files published and verified", rounds, published)
	stopDaemon(t, dm)
}

// abortFUSE frees a hung mount with the product's own remedy, umount
// --force (fusectl abort, then detach), which reads mountinfo only and so
// cannot hang the test.
func abortFUSE(t *testing.T, mnt string) {
	if out, err := exec.Command(bin, "umount", "--force", mnt).CombinedOutput(); err != nil {
		t.Logf("umount --force %s: %v: %s", mnt, err, out)
	}
}
