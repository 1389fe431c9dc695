package fusefs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
	"github.com/alkblobfs/alkblobfs/rundir"
	"golang.org/x/sys/unix"
)

// Dead mounts. A daemon killed while one of its threads waits in the
// kernel (for a directory lock that a LOOKUP holds while it waits for the
// daemon) cannot exit: it keeps /dev/fuse open, the connection never
// aborts, and every process that touches the mount sleeps. Only aborting
// the connection through fusectl frees them. So a mount records its
// daemon's pid beside the mountpoint's name (a pid file in a runtime
// directory), and the next mount of the same mountpoint, or `umount
// --force`, finds the mount in mountinfo — never touching it — and aborts
// the connection of a daemon that is gone or dying before detaching it.

// pidFile is where the daemon serving mountpoint dir records its pid: in
// the runtime directory (rundir), which also holds a system server's
// socket.
func pidFile(dir string) string {
	h := sha256.Sum256([]byte(dir))
	return filepath.Join(rundir.Dir(), hex.EncodeToString(h[:8])+".pid")
}

// writePidFile records this process as the daemon of the mount on dir,
// with the mount's FUSE connection number: a record only ever speaks for
// that one connection.
func writePidFile(dir string) error {
	m, ok, err := fusectl.Find(dir)
	if err != nil || !ok {
		return fmt.Errorf("find the new mount on %s: %v", dir, err)
	}
	p := pidFile(dir)
	if err := rundir.Make(filepath.Dir(p)); err != nil {
		return err
	}
	start, err := procStart(os.Getpid())
	if err != nil {
		return err
	}
	return os.WriteFile(p, []byte(fmt.Sprintf("%d %d %d %s\n", os.Getpid(), m.Minor, start, dir)), 0o600)
}

// procStart is when process pid started, in clock ticks since boot (field
// 22 of /proc/PID/stat): with the pid, it names one process, which a
// later process given the same pid does not match.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

func removePidFile(dir string) { os.Remove(pidFile(dir)) }

// prunePidFiles removes the pid files whose mount is gone: a record
// speaks only for its connection (see recordedPid), so once that
// connection is no longer mounted on its mountpoint it is of no use to
// anyone, and the pid files of daemons killed and never mounted again
// would otherwise pile up. A record whose mount remains is kept, dead
// daemon or not: it is what clearDeadMount needs.
func prunePidFiles() {
	base := rundir.Dir()
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".pid") {
			continue
		}
		p := filepath.Join(base, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f := strings.SplitN(strings.TrimSuffix(string(b), "\n"), " ", 4)
		if len(f) < 4 || pidFile(f[3]) != p {
			continue // not a record of ours
		}
		m, ok, err := fusectl.Find(f[3])
		if err != nil || ok && strconv.FormatUint(m.Minor, 10) == f[1] {
			continue
		}
		// The mountpoint's next mount may have just written its own
		// record under the same name: remove only the stale one.
		if now, err := os.ReadFile(p); err == nil && string(now) == string(b) {
			os.Remove(p)
		}
	}
}

// recordedPid is the pid recorded for the mount on dir with connection
// minor, and its start time, or 0: a record of another connection (an
// older mount, someone else's since) says nothing about this one.
func recordedPid(dir string, minor uint64) (pid int, start uint64) {
	b, err := os.ReadFile(pidFile(dir))
	if err != nil {
		return 0, 0
	}
	f := strings.SplitN(strings.TrimSuffix(string(b), "\n"), " ", 4)
	if len(f) < 4 || f[3] != dir || f[1] != strconv.FormatUint(minor, 10) {
		return 0, 0
	}
	pid, err = strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return 0, 0
	}
	start, err = strconv.ParseUint(f[2], 10, 64)
	if err != nil {
		return 0, 0
	}
	return pid, start
}

// daemonGone reports whether the process pid that started at start has
// exited (its pid free, or another process's now), is a zombie, or has
// SIGKILL pending (killed, but a thread is stuck in the kernel).
func daemonGone(pid int, start uint64) bool {
	exited, dying := daemonState(pid, start)
	return exited || dying
}

// daemonState tells whether the process pid that started at start has
// exited (its pid free, or another process's now), or else is dying: a
// zombie, or SIGKILL pending.
func daemonState(pid int, start uint64) (exited, dying bool) {
	if now, err := procStart(pid); err != nil || now != start {
		return true, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			if strings.HasPrefix(v, "Z") || strings.HasPrefix(v, "X") {
				return false, true
			}
		case "ShdPnd", "SigPnd":
			if m, err := strconv.ParseUint(v, 16, 64); err == nil && m&(1<<(unix.SIGKILL-1)) != 0 {
				return false, true
			}
		}
	}
	return false, false
}

// clearDeadMount frees dir if an alkblobfs mount on it lost its daemon:
// it aborts the connection and detaches the mount. A mount whose daemon is
// alive is an error (busy); anything else is left to the caller.
func clearDeadMount(dir string, lg *slog.Logger) error {
	m, ok, err := fusectl.Find(dir)
	if err != nil || !ok || m.FSType != "fuse.alkblobfs" {
		return err
	}
	pid, start := recordedPid(dir, m.Minor)
	if pid == 0 {
		return nil
	}
	if !daemonGone(pid, start) {
		return fmt.Errorf("mountpoint %s is busy: alkblobfs (pid %d) serves it", dir, pid)
	}
	lg.Warn("stale mount left by a daemon that died; aborting its FUSE connection and detaching it", "mountpoint", dir, "pid", pid, "connection", m.Minor)
	if err := fusectl.Abort(m.Minor); err != nil {
		lg.Warn("could not abort the dead mount's connection", "err", err)
	}
	removePidFile(dir)
	if err := detach(dir); err != nil {
		return fmt.Errorf("mountpoint %s: dead mount, and detaching it failed: %w", dir, err)
	}
	return nil
}

// Unmount unmounts the FUSE filesystem at dir from outside its daemon.
// A mount with files open is an error (EBUSY) unless force is set. With
// force, the FUSE connection is aborted first (a daemon that is stuck,
// stopped or dead cannot answer an unmount; open files then fail with
// ENOTCONN), and the mount is detached.
func Unmount(dir string, force bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	m, ok, err := fusectl.Find(abs)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%s is not a mountpoint", abs)
	case !m.IsFUSE():
		return fmt.Errorf("%s is not a FUSE mount (%s)", abs, m.FSType)
	}
	if force {
		if err := fusectl.Abort(m.Minor); err != nil {
			return err
		}
		removePidFile(abs)
		return detach(abs)
	}
	err = unix.Unmount(abs, 0)
	if errors.Is(err, unix.EPERM) {
		err = fusermount(abs, "-u")
	}
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("unmount %s: files are open (close them, or use --force, which aborts the connection): %w", abs, err)
	}
	return err
}
