package fusefs

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
)

// The guard. A mount's change consumer (watch.go) invalidates entries
// with a notification that the kernel makes wait for the directory's
// lock, and a request that holds that lock may be waiting on the daemon
// (a mkdir, a lookup). Killed then (SIGKILL, or any signal whose default
// action ends the process), the daemon cannot exit: the notifying thread
// sleeps uninterruptibly and keeps /dev/fuse open, so the kernel never
// aborts the connection as it does for any daemon that dies, the request
// is never answered, the lock never freed, and every process that
// touches the mount sleeps until someone aborts the connection through
// fusectl (the next mount's clearDeadMount, umount --force).
//
// So a mount with a change feed starts a guard: a process of its own
// (this executable run as GuardName, which the command's main hands to
// RunGuard) that holds nothing of the mount, checks the daemon every
// guardEvery and, once the daemon is dying — a zombie, or SIGKILL pending
// (daemonDying) — aborts its connection: what the kernel does when a
// killed daemon's descriptor closes. It leaves the mountpoint as the
// kernel leaves that of any killed daemon (ENOTCONN until unmounted or
// mounted again). It exits when the daemon does. It runs in a session of
// its own and ignores the signals that stop a daemon, so that a signal to
// the daemon's process group (^C at a terminal) does not end it first; a
// SIGKILL sent to it and the daemon together (a whole cgroup killed at
// once) leaves the hang to clearDeadMount, as before.

// GuardName is the argv[0] under which the executable is a mount's guard.
const GuardName = "alkblobfs-mount-guard"

// guardEvery is how often the guard looks at its daemon: the longest a
// killed daemon's mount hangs.
const guardEvery = 100 * time.Millisecond

// A daemon that hands its mount over (handover.go) retires its guard
// before it exits: the successor serves the connection, with a guard of
// its own, and the old daemon's exit, as it closes the descriptor it
// still holds, is exactly what this guard aborts for. A guard that
// outlived its retirement (the old daemon killed before it could) still
// leaves the connection alone: the pid record names the successor.

// guardProc is a running guard, a child of the daemon it guards.
type guardProc struct {
	proc   *os.Process
	reaped chan struct{}
}

// startGuard starts the guard of this process's mount on dir. With
// restart, it keeps a duplicate of the server's /dev/fuse descriptor,
// what INIT settled and this process's command line, to restart a
// crashed daemon (restart.go); and this process's standard error, for
// the restarted daemon's log.
func startGuard(dir string, server *fuse.Server, restart bool) (*guardProc, error) {
	m, ok, err := fusectl.Find(dir)
	if err != nil || !ok {
		return nil, fmt.Errorf("find the new mount on %s: %v", dir, err)
	}
	minor := m.Minor
	// A guard that could not abort the connection (no root) guards
	// nothing: say so at mount time, not silently when it is needed.
	if err := fusectl.CanAbort(minor); err != nil {
		return nil, err
	}
	start, err := procStart(os.Getpid())
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{
		Path: "/proc/self/exe",
		Args: []string{GuardName, dir, strconv.Itoa(os.Getpid()), strconv.FormatUint(start, 10), strconv.FormatUint(minor, 10)},
		// No standard streams: a guard must not hold the daemon's
		// stderr pipe open after the daemon (a parent waiting for EOF).
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if restart {
		fd, err := server.DupFD()
		if err != nil {
			return nil, err
		}
		conn := os.NewFile(uintptr(fd), "/dev/fuse")
		defer conn.Close()
		init, err := json.Marshal(server.InitState())
		if err != nil {
			return nil, err
		}
		argv, err := json.Marshal(os.Args)
		if err != nil {
			return nil, err
		}
		cmd.Args = append(cmd.Args, guardRestart)
		cmd.ExtraFiles = []*os.File{conn} // fd 3
		cmd.Env = append(os.Environ(), envRestartInit+"="+string(init), envGuardArgs+"="+string(argv))
		// Held for the restarted daemon's log: with --restart-on-crash,
		// a pipe on the daemon's stderr stays open while its guard runs.
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &guardProc{proc: cmd.Process, reaped: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(g.reaped)
	}()
	return g, nil
}

// guardRestart is the guard's fifth argument when it restarts its daemon
// after a crash; envGuardArgs then holds the daemon's command line (a
// JSON array).
const (
	guardRestart = "restart"
	envGuardArgs = "ALKBLOBFS_GUARD_ARGS"
)

// guardFD is the descriptor of the connection a restarting guard holds.
const guardFD = 3

// retire ends the guard of a daemon that handed its mount over, and
// waits until it is gone (at most timeout).
func (g *guardProc) retire(timeout time.Duration) error {
	if g == nil {
		return nil
	}
	g.proc.Kill() // it ignores the polite signals (RunGuard)
	select {
	case <-g.reaped:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("the guard (pid %d) did not exit within %s of SIGKILL", g.proc.Pid, timeout)
	}
}

// RunGuard is the guard's main (args: mountpoint, daemon pid, its start
// time, connection minor, and guardRestart if it restarts the daemon
// after a crash); it returns the exit status.
func RunGuard(args []string) int {
	// Caught, not ignored: a daemon this guard restarts gets the default
	// actions back (an ignored signal would stay ignored across exec).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	if len(args) != 4 && (len(args) != 5 || args[4] != guardRestart) {
		return 2
	}
	dir := args[0]
	pid, err1 := strconv.Atoi(args[1])
	start, err2 := strconv.ParseUint(args[2], 10, 64)
	minor, err3 := strconv.ParseUint(args[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 2
	}
	var rs *restarter
	if len(args) == 5 {
		rs = newRestarter(dir, minor)
	}
	closeFUSE(rs != nil)
	for {
		time.Sleep(guardEvery) // a poll: the kernel tells no one of a dying process
		// The guard's mount gone from dir (unmounted, or another mount's
		// now): nothing is left to guard. A minor is reused by the next
		// mount, so one seen again later may be another daemon's.
		m, ok, err := fusectl.Find(dir)
		if err == nil && (!ok || m.Minor != minor) {
			return 0
		}
		exited, dying := daemonState(pid, start)
		if !exited && !dying {
			continue
		}
		// One that handed the mount over and was killed before it
		// retired this guard leaves it to the successor the pid record
		// names.
		if successorServes(dir, minor, pid) {
			return 0
		}
		if rs != nil {
			// A crash: the connection lives on in this guard's
			// descriptor, its requests queued, until a daemon serves
			// it again or it is aborted.
			np, err := rs.restart()
			if err == nil {
				pid, start = np.pid, np.start
				continue
			}
			if errors.Is(err, errUnmounted) {
				return 0
			}
			rs.log("the mount's daemon died and was not restarted: %v; aborting its connection", err)
			if err := fusectl.Abort(minor); err != nil {
				return 1
			}
			return 0
		}
		if exited {
			return 0
		}
		// A dying daemon that still holds /dev/fuse is the hang above.
		// One that holds none (a zombie not yet reaped, which unmounted
		// and closed it cleanly) leaves the connection to whoever
		// mounted on dir since.
		if err == nil && ok && holdsFUSE(pid) {
			if err := fusectl.Abort(minor); err != nil {
				return 1
			}
		}
		return 0
	}
}

// successorServes reports whether the pid record of the connection
// minor on dir names a live daemon other than pid: one pid handed the
// mount to.
func successorServes(dir string, minor uint64, pid int) bool {
	rp, rstart := recordedPid(dir, minor)
	return rp != 0 && rp != pid && !daemonGone(rp, rstart)
}

// holdsFUSE reports whether a thread of process pid has /dev/fuse open.
// Each thread is looked at: a zombie leader's own fd directory is empty
// while a thread stuck in the kernel keeps the descriptor table.
func holdsFUSE(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/fd", pid))
	for _, dir := range tasks {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == "/dev/fuse" {
				return true
			}
		}
	}
	return false
}

// closeFUSE closes any /dev/fuse descriptor the guard inherited: holding
// one would keep the connection from aborting when the daemon's closes.
// A restarting guard keeps the one it was given (guardFD).
func closeFUSE(restart bool) {
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "/dev/fuse" {
			if n, err := strconv.Atoi(e.Name()); err == nil && !(restart && n == guardFD) {
				syscall.Close(n)
			}
		}
	}
}
