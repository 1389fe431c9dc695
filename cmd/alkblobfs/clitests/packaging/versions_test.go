//go:build linux

package packaging

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestCompoundRedirectKeepsOthersReference: `{ cat header; cat body; } >
// incoming/combined` commits the header alone when the first cat closes its
// copy of the descriptor, and never links it: the final content replaces
// it. If the header's content was put and linked by the CLI in between,
// that reference is the CLI's: it must stay, and survive two sweeps.
func TestCompoundRedirectKeepsOthersReference(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	dir := t.TempDir()
	headerPath, _, header := clitest.WriteFile(t, dir, 100, 1)
	bodyPath, body, _ := clitest.WriteFile(t, dir, 5000, 2)
	headerBytes, _ := os.ReadFile(headerPath)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt)

	for _, cliPut := range []bool{false, true} {
		step1, step2 := filepath.Join(dir, fmt.Sprint("step1-", cliPut)), filepath.Join(dir, fmt.Sprint("step2-", cliPut))
		target := filepath.Join(mnt, "ns", "incoming", fmt.Sprint("combined-", cliPut))
		script := fmt.Sprintf(`{ cat %q; touch %q; while [ ! -e %q ]; do sleep 0.02; done; cat %q; } > %q`,
			headerPath, step1, step2, bodyPath, target)
		sh := exec.Command("sh", "-c", script)
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		defer sh.Process.Kill()
		clitest.Eventually(t, 10*time.Second, "the shell's second command", func() bool {
			_, err := os.Stat(step1)
			return err == nil
		})
		if cliPut {
			if got := c.OK("put", "--ns", "ns", headerPath); got != header+"\n" {
				t.Fatalf("put printed %q", got)
			}
		}
		if err := os.WriteFile(step2, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sh.Wait(); err != nil {
			t.Fatalf("shell: %v", err)
		}
		combined := clitest.Sum(append(slices.Clone(headerBytes), body...))
		listed := clitest.Lines(c.OK("ls", "ns"))
		if !slices.Contains(listed, combined) {
			t.Fatalf("cliPut=%v: the final content %s is not linked: %v", cliPut, combined, listed)
		}
		if slices.Contains(listed, header) != cliPut {
			t.Fatalf("cliPut=%v: the header %s linked = %v; want %v", cliPut, header, !cliPut, cliPut)
		}
	}
	c.OK("sweep")
	c.OK("sweep")
	c.OK("get", header, "-o", filepath.Join(dir, "header-back"))
	clitest.StopDaemon(t, dm)
}

// emptyDigest is the sha256 of nothing.
const emptyDigest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// TestRedirectPublishesNoEmptyVersion: a shell's `(sleep; echo x) > f`
// flushes once before anything is written; the namespace never shows the
// empty version, neither while the command runs nor after the daemon is
// killed during it. An explicitly empty file (`: > f`) still publishes.
func TestRedirectPublishesNoEmptyVersion(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt)
	nsDir := filepath.Join(mnt, "ns")
	// The command writes once the namespace has been polled 20 times with
	// f open and empty: a count, not a time (on a loaded machine half a
	// second held fewer than 10 polls).
	gate := filepath.Join(t.TempDir(), "write")
	sh := exec.Command("sh", "-c", fmt.Sprintf(`(while [ ! -e %q ]; do sleep 0.05; done; echo x) > %q`, gate, filepath.Join(nsDir, "incoming", "f")))
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	clitest.Eventually(t, 30*time.Second, "the shell to create incoming/f", func() bool {
		_, err := os.Stat(filepath.Join(nsDir, "incoming", "f"))
		return err == nil
	})
	done := make(chan error, 1)
	go func() { done <- sh.Wait() }()
	polls := 0
poll:
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("shell: %v", err)
			}
			break poll
		default:
		}
		names, err := os.ReadDir(nsDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range names {
			if e.Name() == emptyDigest {
				t.Fatal("the empty version of a redirection showed in the namespace")
			}
		}
		if polls++; polls == 20 {
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !slices.Contains(clitest.Lines(c.OK("ls", "ns")), clitest.Sum([]byte("x\n"))) {
		t.Fatal("the redirection's content was not published")
	}
	if polls < 10 {
		t.Fatalf("only %d polls while the command ran", polls)
	}

	// Killed during the command: after restart, no empty blob is linked.
	sh = exec.Command("sh", "-c", fmt.Sprintf(`(sleep 2; echo y) > %q`, filepath.Join(nsDir, "incoming", "g")))
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed once the redirection has created g (its empty version), not
	// after a guess at how long the shell takes to start.
	clitest.Eventually(t, 30*time.Second, "the shell to create incoming/g", func() bool {
		_, err := os.Stat(filepath.Join(nsDir, "incoming", "g"))
		return err == nil
	})
	dm.Cmd.Process.Kill()
	dm.Wait(20 * time.Second)
	sh.Process.Kill()
	sh.Wait()
	if slices.Contains(clitest.Lines(c.OK("ls", "ns")), emptyDigest) {
		t.Fatal("the empty version is linked after the daemon was killed during the command")
	}
	dm = clitest.StartDaemon(t, c.Data, mnt)
	if err := exec.Command("sh", "-c", fmt.Sprintf(`: > %q`, filepath.Join(nsDir, "incoming", "empty"))).Run(); err != nil {
		t.Fatal(err)
	}
	clitest.Eventually(t, 30*time.Second, "an explicitly empty file to publish", func() bool {
		return slices.Contains(clitest.Lines(c.OK("ls", "ns")), emptyDigest)
	})
	clitest.StopDaemon(t, dm)
}

// TestCloseSurvivesCrash: a close that returned 0 is published even when
// the daemon dies before the file's last descriptor is closed (its link
// waits for that RELEASE): the next mount of the same mountpoint links
// it. The version it superseded never shows, before or after.
func TestCloseSurvivesCrash(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "ns")
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt)
	f := filepath.Join(mnt, "ns", "incoming", "f")
	marker := filepath.Join(t.TempDir(), "closed")
	// Two children close their copies of fd 3 after "one" and after
	// "onetwo"; the shell keeps fd 3 open.
	sh := exec.Command("bash", "-c", fmt.Sprintf(`exec 3>%q; printf one >&3; ( exec 3>&- ); printf two >&3; ( exec 3>&- ); touch %q; sleep 60`, f, marker))
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer sh.Process.Kill()
	clitest.Eventually(t, 10*time.Second, "the writer to close its copies", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	final, half := clitest.Sum([]byte("onetwo")), clitest.Sum([]byte("one"))
	if listed := clitest.Lines(c.OK("ls", "ns")); len(listed) != 0 {
		t.Fatalf("the namespace lists %v while the writer still holds the file", listed)
	}
	dm.Cmd.Process.Kill()
	dm.Wait(20 * time.Second)
	sh.Process.Kill()
	sh.Wait()
	if listed := clitest.Lines(c.OK("ls", "ns")); len(listed) != 0 {
		t.Fatalf("the namespace lists %v before the mount came back", listed)
	}
	dm = clitest.StartDaemon(t, c.Data, mnt)
	listed := clitest.Lines(c.OK("ls", "ns"))
	if !slices.Equal(listed, []string{final}) {
		t.Fatalf("after the restart the namespace lists %v; want the last closed version %s alone (not %s)", listed, final[:12], half[:12])
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "ns", final)); err != nil || string(b) != "onetwo" {
		t.Fatalf("the recovered version reads as %q, %v", b, err)
	}
	clitest.StopDaemon(t, dm)
}
