// Package rundir owns the host's runtime directory of alkblobfs processes:
// where root's mounts keep their pid files and lease locks, and where a
// system server's default socket is (/run/alkblobfs), or a user's own
// under $XDG_RUNTIME_DIR (else alkblobfs-UID in the temporary directory).
// The system directory, whichever process makes it first (a mount, or
// serve), ends up as the docs promise: mode 0755, so that every local
// user reaches a socket in it (the socket itself is 0666 and the kernel
// says who connects), while only its owner writes it; what is private in
// it (pid files, the leases directory) is private by its own mode. A
// user's own directory needs no sharing: it is made 0700 and its mode is
// left as its owner set it.
package rundir

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// System is the runtime directory of root's processes.
const System = "/run/alkblobfs"

// Mode is the system runtime directory's mode.
const Mode = 0o755

// UserMode is the mode a user's own runtime directory is made with.
const UserMode = 0o700

// Dir is this process's runtime directory for pid files and lease locks:
// System for root (every root process, whatever its environment, must
// find the same records), else $XDG_RUNTIME_DIR/alkblobfs, else
// alkblobfs-UID in the temporary directory.
func Dir() string {
	if os.Geteuid() == 0 {
		return System
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(x) {
		return filepath.Join(x, "alkblobfs")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("alkblobfs-%d", os.Geteuid()))
}

// Make makes the runtime directory dir (and its parents) if missing.
//
// The system directory (System) is left at Mode: one made 0700 by an
// older alkblobfs (its lease locks made /run/alkblobfs so, which hid a
// system server's socket from every other user) or under a tight umask is
// set back when this process owns it. A directory someone else owns is
// refused unless root does (a system directory used by a user's process).
//
// Any other directory is a user's own ($XDG_RUNTIME_DIR/alkblobfs,
// /tmp/alkblobfs-UID): made UserMode, and its mode never changed. It is
// refused if another user but root owns it (one made in /tmp by another
// user could be theirs to read and replace) — except to root, which
// runs where it is pointed (su keeps a user's XDG_RUNTIME_DIR): a
// directory root makes there is given to the owner of the directory it
// is made in, so that root leaves no directory in a user's runtime
// directory that the user cannot use.
func Make(dir string) error {
	if filepath.Clean(dir) == System {
		return makeSystem(dir)
	}
	return makeUser(dir)
}

func makeSystem(dir string) error {
	if err := os.MkdirAll(dir, Mode); err != nil {
		return fmt.Errorf("runtime directory: %w", err)
	}
	fi, st, err := stat(dir)
	if err != nil || st == nil {
		return err
	}
	switch {
	case int(st.Uid) == os.Geteuid():
		if fi.Mode().Perm() != Mode {
			if err := os.Chmod(dir, Mode); err != nil {
				return fmt.Errorf("runtime directory %s: mode %04o, and making it %04o failed: %w", dir, fi.Mode().Perm(), Mode, err)
			}
		}
	case st.Uid != 0:
		return fmt.Errorf("runtime directory %s: owned by uid %d, not this user (%d) or root; remove it", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o001 == 0:
		return fmt.Errorf("runtime directory %s: mode %04o keeps every user but root out of it; make it %04o as root (an older alkblobfs made it so)", dir, fi.Mode().Perm(), Mode)
	}
	return nil
}

func makeUser(dir string) error {
	_, statErr := os.Lstat(dir)
	if err := os.MkdirAll(dir, UserMode); err != nil {
		return fmt.Errorf("runtime directory: %w", err)
	}
	if os.IsNotExist(statErr) && os.Geteuid() == 0 {
		// Made by root in a user's directory: the user's.
		if pfi, err := os.Stat(filepath.Dir(dir)); err == nil {
			if pst, ok := pfi.Sys().(*syscall.Stat_t); ok && pst.Uid != 0 {
				if err := os.Lchown(dir, int(pst.Uid), int(pst.Gid)); err != nil {
					return fmt.Errorf("runtime directory %s: giving it to uid %d, who owns %s: %w", dir, pst.Uid, filepath.Dir(dir), err)
				}
			}
		}
	}
	_, st, err := stat(dir)
	if err != nil || st == nil {
		return err
	}
	if int(st.Uid) != os.Geteuid() && st.Uid != 0 && os.Geteuid() != 0 {
		return fmt.Errorf("runtime directory %s: owned by uid %d, not this user (%d) or root; remove it", dir, st.Uid, os.Geteuid())
	}
	return nil
}

// stat is dir's Lstat, refusing anything but a directory; st is nil where
// the system gives no owner.
func stat(dir string) (os.FileInfo, *syscall.Stat_t, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("runtime directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("runtime directory %s: not a directory (%s)", dir, fi.Mode().Type())
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	return fi, st, nil
}
