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

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestKill9Loop is the crash campaign: it kills the daemon with SIGKILL
// while three publishers write into one namespace's incoming/ (one of
// them files large enough for the large tier), a fourth writes files into
// another namespace and removes them again, a loop runs sweeps through the
// control file, and two loops stat and list; then it mounts again at
// once. A kill so lands during writes, publishes and sweeps. Every round
// must end: the killed daemon exits (no thread left stuck in the kernel
// behind a LOOKUP that waits for it), and the next mount recovers the dead
// mountpoint (its daemon's recorded pid is gone). At the end every file
// whose close returned 0 is published and verifies, no stage file is
// left, SQLite's integrity check passes, and every namespace's usage
// counters are exact. 5 rounds here, 30 under ALKBLOBFS_LONG=1.
//
// The test never touches the mount from its own process: a hung mount
// would hang it. If a round hangs anyway, it aborts the connection through
// fusectl so that the machine recovers, and fails.
func TestKill9Loop(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	rounds := 5
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		rounds = 30
	}
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "p")
	c.OK("ns", "create", "g")
	mnt := t.TempDir()
	logs := t.TempDir()
	r := rand.New(rand.NewPCG(9, 9))
	sweeps := 0
	for round := range rounds {
		dm := clitest.StartDaemon(t, c.Data, mnt)
		var procs []*exec.Cmd
		for w := range 3 {
			// The sha256 of each copy whose close returned 0 is logged
			// (outside the mount). cp, not a shell redirection: the shell
			// restores its stdout with dup2, which drops the close's error.
			tmp := filepath.Join(logs, fmt.Sprintf("src-%d-%d", round, w))
			fill := fmt.Sprintf(`printf 'round %d writer %d file %%d' $i > %s`, round, w, tmp)
			if w == 2 {
				fill = fmt.Sprintf(`{ head -c 600000 /dev/urandom; echo $i; } > %s`, tmp)
			}
			script := fmt.Sprintf(`i=0; while :; do i=$((i+1)); %s && cp %s %s/p/incoming/w%d-$i && sha256sum < %s | cut -c1-64 >> %s/r%d-w%d; done`,
				fill, tmp, mnt, w, tmp, logs, round, w)
			procs = append(procs, exec.Command("sh", "-c", script))
		}
		garbage := filepath.Join(logs, fmt.Sprintf("garbage-%d", round))
		procs = append(procs,
			exec.Command("sh", "-c", fmt.Sprintf(`i=0; while :; do i=$((i+1)); { head -c 300000 /dev/urandom; echo $i; } > %[1]s && cp %[1]s %[2]s/g/incoming/x && rm -f %[2]s/g/$(sha256sum < %[1]s | cut -c1-64); done`, garbage, mnt)),
			exec.Command("sh", "-c", fmt.Sprintf(`while :; do echo run > %s/.alkblobfs/sweep; sleep 0.05; done`, mnt)))
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
		dm.Cmd.Process.Kill()
		select {
		case <-dm.Done:
		case <-time.After(15 * time.Second):
			clitest.AbortFUSE(t, mnt)
			t.Fatalf("round %d: the killed daemon did not exit within 15s: a thread is stuck in the kernel", round)
		}
		sweeps += strings.Count(dm.Stderr.String(), `msg="sweep done"`)
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
			clitest.AbortFUSE(t, mnt)
			t.Fatalf("round %d: clients of the killed mount stuck", round)
		}
	}
	// The recovery mount cleans up; its start-up removes stage files.
	dm := clitest.StartDaemon(t, c.Data, mnt)
	listed := clitest.Lines(c.OK("ls", "p"))
	published := 0
	for round := range rounds {
		for w := range 3 {
			b, err := os.ReadFile(filepath.Join(logs, fmt.Sprintf("r%d-w%d", round, w)))
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, d := range clitest.Lines(string(b)) {
				if !slices.Contains(listed, d) {
					t.Errorf("round %d writer %d: close returned 0 but %s is not published", round, w, d)
				}
				published++
			}
		}
	}
	if published == 0 || sweeps == 0 {
		t.Fatalf("%d files published, %d sweeps: the workload never ran", published, sweeps)
	}
	c.OK("verify") // every blob re-hashed
	stage, _ := os.ReadDir(filepath.Join(c.Data, "large", "stage"))
	if len(stage) > 0 {
		t.Errorf("%d stage files survived start-up", len(stage))
	}
	clitest.StopDaemon(t, dm)
	integrityCheck(t, filepath.Join(c.Data, "kv.db"))
	usageExact(t, filepath.Join(c.Data, "kv.db"))
	t.Logf("%d rounds, %d sweeps, %d files published and verified", rounds, sweeps, published)
}

// usageExact checks that every namespace's usage counters (blobs and
// bytes held by a link or an intent) are what its rows hold: Recount,
// which compares them namespace by namespace, finds nothing to fix.
func usageExact(t *testing.T, path string) {
	t.Helper()
	e, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r, err := namespaces.OpenSQL(t.Context(), e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Recount(t.Context()); err != nil || n != 0 {
		t.Fatalf("Recount of %s fixed the counters of %d namespaces (%v): usage was not exact after kill -9", path, n, err)
	}
}

// integrityCheck runs SQLite's PRAGMA integrity_check on the database.
func integrityCheck(t *testing.T, path string) {
	t.Helper()
	e, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var res string
	if err := e.DB().QueryRowContext(t.Context(), "PRAGMA integrity_check").Scan(&res); err != nil {
		t.Fatal(err)
	}
	if res != "ok" {
		t.Fatalf("PRAGMA integrity_check of %s: %s", path, res)
	}
}
