//go:build linux

package fusefs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// Child processes. This binary serves the mounts its tests use, so a page
// fault on one of their files must happen elsewhere: the faulting thread
// is running as far as the Go runtime knows, a stop-the-world (a GC, which
// the handler answering the fault may start by allocating) waits for it,
// and it waits for the handler. Nothing then runs, not even -timeout's
// panic. Such a test runs the faulting part in a child: this binary again,
// with childEnv naming what to do, picked up by init before any test (or
// TestMain) starts.

const childEnv = "FUSEFS_TEST_CHILD"

// childModes are what a child can do, given the arguments inChild passed.
var childModes = map[string]func(args []string) error{
	"mmap-write":      mmapWriteChild,
	"mkdir-signalled": mkdirSignalledChild,
}

func init() {
	mode, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	f := childModes[mode]
	if f == nil {
		fmt.Fprintf(os.Stderr, "%s=%q: no such child mode\n", childEnv, mode)
		os.Exit(2)
	}
	if err := f(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mode, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// inChild runs mode in a child process with args and returns its output.
// It fails t if the child fails, or has not finished within within: a
// request the child made to a mount of this process hung, or the mount
// did. A child that does not die when killed is left to the harness's
// unmount, which aborts the connection it waits on.
func inChild(t testing.TB, within time.Duration, mode string, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	out := &fusetest.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("child %s: %v", mode, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("child %s %s: %v\n%s", mode, strings.Join(args, " "), err, out)
		}
		return out.String()
	case <-time.After(within):
	}
	cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Errorf("child %s (pid %d) still there 5s after SIGKILL", mode, cmd.Process.Pid)
	}
	t.Fatalf("child %s %s did not finish within %s (killed): a request to the mount hung?\n%s", mode, strings.Join(args, " "), within, out)
	return ""
}

// mmapWriteChild writes randBytes(seed, size) to path (created) through a
// shared mapping: ftruncate, mmap, store, msync, munmap, close.
func mmapWriteChild(args []string) error {
	var seed uint64
	var size int
	if len(args) != 3 {
		return errors.New("want PATH SEED SIZE")
	}
	if _, err := fmt.Sscan(args[1]+" "+args[2], &seed, &size); err != nil {
		return fmt.Errorf("seed and size %q %q: %v", args[1], args[2], err)
	}
	return mmapWrite(args[0], randBytes(seed, size))
}
