package fusefs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

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

// ControlSocket is where the daemon serving mountpoint dir (absolute,
// symbolic links resolved) takes requests of its own kind: `alkblobfs
// upgrade`. Beside its pid file, mode 0600: root and the mount's owner
// reach it.
func ControlSocket(dir string) string {
	return strings.TrimSuffix(pidFile(dir), ".pid") + ".sock"
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
	return writeRecord(p, fmt.Sprintf("%d %d %d %s\n", os.Getpid(), m.Minor, start, dir))
}

// writeRecord writes a record of the runtime directory (mode 0600) whole
// or not at all, a temporary file renamed over it: a reader,
// prunePidFiles above all, never sees a record half written, and a
// record once read is replaced by a new inode, never rewritten in place,
// so that "unchanged since read" is its inode.
func writeRecord(p, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+"-*.tmp") // 0600
	if err != nil {
		return err
	}
	_, err = tmp.WriteString(content)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
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

// prunePidFiles removes the pid files of daemons that have exited: their
// pid is free, or another process's now (its start time differs from the
// recorded one), and their connection is not mounted here, so the record
// speaks for nothing any more; the records of daemons killed and never
// mounted again would otherwise pile up. A record whose daemon lives
// (dying included: clearDeadMount needs it) stays, whether or not its
// mountpoint is in this process's mountinfo: a mount in another mount
// namespace (a container, systemd's PrivateMounts) is not, and `umount
// --force` there needs its record. A record is removed only if it is the
// one read: see removeIfSame.
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
		b, fi, err := readRecord(p)
		if err != nil {
			continue
		}
		f := strings.SplitN(strings.TrimSuffix(string(b), "\n"), " ", 4)
		if len(f) < 4 || pidFile(f[3]) != p {
			continue // not a record of ours
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid <= 0 {
			continue
		}
		if !daemonExited(pid, f[2]) {
			continue
		}
		if m, ok, err := fusectl.Find(f[3]); err != nil || ok && strconv.FormatUint(m.Minor, 10) == f[1] {
			continue // its mount remains here: clearDeadMount's
		}
		removeIfSame(p, fi)
		removeDeadSocket(strings.TrimSuffix(p, ".pid") + ".sock")
		os.Remove(strings.TrimSuffix(p, ".pid") + ".restarts") // restart.go's count, for a connection gone

	}
}

// removeDeadSocket removes the control socket (ControlSocket) a killed
// daemon left beside its record, unless something answers on it.
func removeDeadSocket(path string) {
	if _, err := os.Lstat(path); err != nil {
		return
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return
	}
	os.Remove(path)
}

// readRecord reads the pid file p and stats the inode it read.
func readRecord(p string) ([]byte, os.FileInfo, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(f)
	return b, fi, err
}

// daemonExited tells whether the daemon pid, recorded with start (its
// start time, or "" in a record without one), has exited: its pid is
// free, or the process that has it started at another time.
func daemonExited(pid int, start string) bool {
	now, err := procStart(pid)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	if want, err := strconv.ParseUint(start, 10, 64); err == nil {
		return now != want
	}
	return false // no start time to tell a reused pid by: alive
}

// removeIfSame removes the pid file p if it is still the inode read (fi):
// a new mount of the same mountpoint may have renamed its own record
// over it since. The record is first moved aside (a rename, atomic), so
// that what is removed is what was moved, and checked there; a fresh
// record moved by mistake is put back, unless a newer one is there
// already.
func removeIfSame(p string, fi os.FileInfo) {
	aside := fmt.Sprintf("%s.%d.prune", p, os.Getpid())
	if err := os.Rename(p, aside); err != nil {
		return
	}
	if now, err := os.Lstat(aside); err == nil && os.SameFile(now, fi) {
		os.Remove(aside)
		return
	}
	// A link, not a rename, puts it back: it fails if a newer record is
	// there already, which then wins.
	os.Link(aside, p)
	os.Remove(aside)
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
