//go:build linux

// Package fusectl finds FUSE mounts in /proc/self/mountinfo and aborts
// their connections through the fusectl filesystem. Finding a mount never
// touches it: a stat of a mount whose daemon is dead or stuck would hang
// the caller. The mount (stale mounts, umount --force) and the test
// harnesses (a test that gives up on an unmount) share it.
package fusectl

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is where the kernel lists FUSE connections.
const Dir = "/sys/fs/fuse/connections"

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	Dir    string
	FSType string
	// Minor is the device minor: a FUSE mount's connection number.
	Minor uint64
}

// IsFUSE reports whether the mount is a FUSE filesystem.
func (m Mount) IsFUSE() bool { return strings.HasPrefix(m.FSType, "fuse") }

// Find looks dir up in /proc/self/mountinfo and returns the last mount on
// it (the one a path reaches). dir must be as mountinfo names it: clean,
// absolute, without symbolic links.
func Find(dir string) (Mount, bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Mount{}, false, err
	}
	defer f.Close()
	var found Mount
	ok := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 0:52 / /tmp/mnt rw,... - fuse.alkblobfs /srv/blobs rw,...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || Unescape(fields[4]) != dir {
			continue
		}
		m := Mount{Dir: dir}
		if _, minor, cut := strings.Cut(fields[2], ":"); cut {
			m.Minor, _ = strconv.ParseUint(minor, 10, 32)
		}
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) {
				m.FSType = fields[i+1]
				break
			}
		}
		found, ok = m, true
	}
	return found, ok, sc.Err()
}

// Unescape undoes mountinfo's octal escapes (\040 for a space).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Abort aborts FUSE connection n, mounting fusectl on Dir first if it is
// not (root only): every request waiting on the connection fails at once
// (ENOTCONN), and the mount can be detached.
func Abort(n uint64) error {
	abort, err := abortFile(n)
	if err != nil {
		return err
	}
	if err := os.WriteFile(abort, []byte("1"), 0); err != nil {
		return fmt.Errorf("abort FUSE connection %d: %w", n, err)
	}
	return nil
}

// CanAbort reports, as an error saying why not, whether this process
// could abort connection n (Abort): fusectl mounted, or mountable, and the
// connection's abort file writable, which takes root.
func CanAbort(n uint64) error {
	abort, err := abortFile(n)
	if err != nil {
		return err
	}
	if err := unix.Access(abort, unix.W_OK); err != nil {
		return fmt.Errorf("abort FUSE connection %d: %s: %w", n, abort, err)
	}
	return nil
}

// abortFile returns the path of connection n's abort file, mounting
// fusectl on Dir first if the connection is not listed there.
func abortFile(n uint64) (string, error) {
	ctl := filepath.Join(Dir, strconv.FormatUint(n, 10))
	if _, err := os.Stat(ctl); err != nil {
		if merr := unix.Mount("fusectl", Dir, "fusectl", 0, ""); merr != nil && !errors.Is(merr, unix.EBUSY) {
			return "", fmt.Errorf("FUSE connection %d: mount fusectl on %s: %w", n, Dir, merr)
		}
	}
	return filepath.Join(ctl, "abort"), nil
}
