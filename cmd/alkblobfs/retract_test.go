//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestRetractionKeepsOthersReference: `{ cat header; cat body; } >
// incoming/combined` publishes the header alone when the first cat closes
// its copy of the descriptor, and takes that version back when the final
// content publishes. If the header's content was put and linked by the CLI
// in between, the reference is the CLI's: it must stay, and survive two
// sweeps. Without the CLI's put the header version is taken back.
func TestRetractionKeepsOthersReference(t *testing.T) {
	requireFUSE(t)
	c := newCLI(t)
	c.ok("ns", "create", "ns")
	dir := t.TempDir()
	headerPath, _, header := writeFile(t, dir, 100, 1)
	bodyPath, body, _ := writeFile(t, dir, 5000, 2)
	headerBytes, _ := os.ReadFile(headerPath)
	mnt := t.TempDir()
	dm := startDaemon(t, c.data, mnt)

	for _, cliPut := range []bool{false, true} {
		step1, step2 := filepath.Join(dir, fmt.Sprint("step1-", cliPut)), filepath.Join(dir, fmt.Sprint("step2-", cliPut))
		target := filepath.Join(mnt, "ns", "incoming", fmt.Sprint("combined-", cliPut))
		script := fmt.Sprintf(`{ cat %q; touch %q; while [ ! -e %q ]; do sleep 0.02; done; cat %q; } > %q`,
			headerPath, step1, step2, bodyPath, target)
		sh := exec.Command("sh", "-c", script)
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(step1); err == nil {
				break
			}
			if time.Now().After(deadline) {
				sh.Process.Kill()
				t.Fatal("the shell never reached its second command")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if cliPut {
			if got := c.ok("put", "--ns", "ns", headerPath); got != header+"\n" {
				t.Fatalf("put printed %q", got)
			}
		}
		if err := os.WriteFile(step2, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sh.Wait(); err != nil {
			t.Fatalf("shell: %v", err)
		}
		combined := sum(append(slices.Clone(headerBytes), body...))
		listed := lines(c.ok("ls", "ns"))
		if !slices.Contains(listed, combined) {
			t.Fatalf("cliPut=%v: the final content %s is not linked: %v", cliPut, combined, listed)
		}
		if slices.Contains(listed, header) != cliPut {
			t.Fatalf("cliPut=%v: the header %s linked = %v; want %v", cliPut, header, !cliPut, cliPut)
		}
	}
	c.ok("sweep")
	c.ok("sweep")
	c.ok("get", header, "-o", filepath.Join(dir, "header-back"))
	stopDaemon(t, dm)
}
