// Package rundir owns the host's runtime directory of alkblobfs processes:
// where root's mounts keep their pid files and lease locks, and where a
// system server's default socket is (/run/alkblobfs), or a user's own
// under $XDG_RUNTIME_DIR. Whichever process makes it first (a mount, or
// serve), it ends up as the docs promise: mode 0755, so that every local
// user reaches a socket in it (the socket itself is 0666 and the kernel
// says who connects), while only its owner writes it; what is private in
// it (pid files, the leases directory) is private by its own mode.
package rundir

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// System is the runtime directory of root's processes.
const System = "/run/alkblobfs"

// Mode is the runtime directory's mode.
const Mode = 0o755

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

// Make makes the runtime directory dir (and its parents) if missing, and
// leaves it at Mode: one made 0700 by an older alkblobfs (its lease locks
// made /run/alkblobfs so, which hid a system server's socket from every
// other user) or under a tight umask is set back when this process owns
// it. A directory someone else owns is refused unless root does (a
// system directory used by a user's process): a runtime directory another
// user made, in /tmp say, could be theirs to read and replace.
func Make(dir string) error {
	if err := os.MkdirAll(dir, Mode); err != nil {
		return fmt.Errorf("runtime directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("runtime directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("runtime directory %s: not a directory (%s)", dir, fi.Mode().Type())
	case !ok:
		return nil
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
