package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/alkblobfs/alkblobfs/engines"
)

// envReadyFD names the descriptor on which a daemonized mount (the child
// of mount --daemon) reports: "ready" once it serves, or the error that
// stopped it.
const envReadyFD = "ALKBLOBFS_DAEMON_READY_FD"

// daemonReady is the line a daemonized mount writes once it serves.
const daemonReady = "ready"

// readyTimeout bounds how long mount --daemon waits for its child.
const readyTimeout = 2 * time.Minute

// spawnDaemon runs this command again as a detached child (its own
// session, stdin from /dev/null, stdout and stderr appended to logFile)
// and returns once the child serves the mount, or with the child's error
// if it could not. The child is told by envReadyFD where to report.
func spawnDaemon(ctx context.Context, logFile string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--daemon: find this program: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(logFile), 0o700); err != nil {
		return fmt.Errorf("--daemon: log file: %w", err)
	}
	lf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("--daemon: log file: %w", err)
	}
	defer lf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	child := exec.Command(exe, os.Args[1:]...)
	child.Env = append(os.Environ(), envReadyFD+"=3")
	child.Stdin, child.Stdout, child.Stderr = null, lf, lf
	child.ExtraFiles = []*os.File{w}
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		w.Close()
		return fmt.Errorf("--daemon: start: %w", err)
	}
	w.Close()
	pid := child.Process.Pid
	// Until it reports, the child is ours: on a timeout or an interrupt
	// it is stopped, so that a failed command leaves no mount behind.
	giveUp := func(why error) error {
		child.Process.Signal(syscall.SIGTERM)
		exited := make(chan struct{})
		go func() { child.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			child.Process.Kill()
			<-exited
		}
		return why
	}

	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		switch {
		case s == daemonReady:
			child.Process.Release() // it outlives us
			return nil
		case s != "":
			return giveUp(errors.New(s))
		}
		return giveUp(fmt.Errorf("the mount daemon (pid %d) exited before it served; see %s", pid, logFile))
	case <-time.After(readyTimeout):
		return giveUp(fmt.Errorf("the mount daemon (pid %d) did not serve within %s, and was stopped; see %s", pid, readyTimeout, logFile))
	case <-ctx.Done():
		return giveUp(fmt.Errorf("interrupted before the mount daemon (pid %d) served; it was stopped", pid))
	}
}

// defaultLogFile is where mount --daemon logs without --log-file:
// mount.log in the data directory, or, when that cannot be written (a
// store on read-only media), under the user's state directory
// ($XDG_STATE_HOME, ~/.local/state; /var/log for root).
func defaultLogFile(data string) string {
	if data != "" && engines.Writable(data) {
		return filepath.Join(data, "mount.log")
	}
	if os.Geteuid() == 0 {
		return "/var/log/alkblobfs/mount.log"
	}
	if x := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "alkblobfs", "mount.log")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "alkblobfs", "mount.log")
	}
	return ""
}

// readyReporter is the child's side of spawnDaemon: nil when this process
// was not started by mount --daemon.
type readyReporter struct{ w io.WriteCloser }

func daemonChild() *readyReporter {
	v := os.Getenv(envReadyFD)
	if v == "" {
		return nil
	}
	os.Unsetenv(envReadyFD)
	var fd int
	if _, err := fmt.Sscan(v, &fd); err != nil || fd < 3 {
		return nil
	}
	return &readyReporter{w: os.NewFile(uintptr(fd), "ready")}
}

// ready tells the waiting parent that the mount serves.
func (r *readyReporter) ready() {
	if r != nil && r.w != nil {
		fmt.Fprintln(r.w, daemonReady)
		r.w.Close()
		r.w = nil
	}
}

// failed hands the parent the error that stops the daemon (after ready it
// has no one to tell).
func (r *readyReporter) failed(err error) {
	if r != nil && r.w != nil && err != nil {
		fmt.Fprintln(r.w, strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; "))
		r.w.Close()
		r.w = nil
	}
}
