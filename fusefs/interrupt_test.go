//go:build linux

package fusefs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// slowAnswers is a registry whose namespace creations commit, then take
// a while to answer: a caller's signal then lands after the change was
// made, which is when an interrupt must not turn into an error.
type slowAnswers struct {
	namespaces.Registry
	committed chan string
}

func (r *slowAnswers) CreatePerm(ctx context.Context, name string, p namespaces.Perm) error {
	if err := r.Registry.CreatePerm(ctx, name, p); err != nil {
		return err
	}
	r.committed <- name
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Second):
		return nil
	}
}

// TestInterruptAfterCommit: a mkdir whose caller is signalled while the
// daemon answers it, after the namespace was created, succeeds. Before
// namespace changes ran uninterrupted, go-fuse cancelled the request's
// context on the kernel's INTERRUPT and the mkdir failed with EINTR,
// although the namespace existed (and Go's os.Mkdir, which retries
// EINTR, then failed with EEXIST).
func TestInterruptAfterCommit(t *testing.T) {
	slow := &slowAnswers{committed: make(chan string, 1)}
	e := mountStore(t, defaultSpec, func(c *Config) {
		slow.Registry = c.Namespaces
		c.Namespaces = slow
	})
	path := filepath.Join(e.mnt, "signalled")

	cmd := exec.Command(os.Args[0], path)
	cmd.Env = append(os.Environ(), childEnv+"=mkdir-signalled")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &fusetest.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string) string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the child ended before it printed %s: %v\n%s", what, cmd.Wait(), stderr)
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("the child printed no %s within 20s\n%s", what, stderr)
		}
		return ""
	}
	tid, err := strconv.Atoi(next("thread id"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-slow.committed:
	case <-time.After(20 * time.Second):
		t.Fatalf("the daemon never committed the child's mkdir\n%s", stderr)
	}
	// The thread in mkdir(2) is the one signalled, so the kernel sees a
	// signal pending on the request's task and sends INTERRUPT.
	if err := syscall.Tgkill(cmd.Process.Pid, tid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if got := next("mkdir's result"); got != "ok" {
		t.Fatalf("a mkdir signalled after its namespace was created = %s; want success", got)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the namespace is not there: %v", err)
	}
}

// mkdirSignalledChild prints the id of the thread that then calls
// mkdir(2) on args[0] once, with a SIGUSR1 handler installed and no retry
// of EINTR, and prints "ok" or the errno's name.
func mkdirSignalledChild(args []string) error {
	if len(args) != 1 {
		return errors.New("want the directory to make")
	}
	signal.Notify(make(chan os.Signal, 1), syscall.SIGUSR1)
	runtime.LockOSThread()
	fmt.Println(syscall.Gettid())
	err := syscall.Mkdir(args[0], 0o755)
	var en syscall.Errno
	switch {
	case err == nil:
		fmt.Println("ok")
	case errors.As(err, &en):
		fmt.Println(strings.ToUpper(unixErrnoName(en)))
	default:
		return err
	}
	return nil
}

// unixErrnoName is the errno's symbolic name where the test cares.
func unixErrnoName(e syscall.Errno) string {
	switch e {
	case syscall.EINTR:
		return "eintr"
	case syscall.EEXIST:
		return "eexist"
	}
	return e.Error()
}
