package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/alkblobfs/alkblobfs/store"
)

// mountSource is what a mount shows as its source: the first field of
// /proc/mounts, findmnt's SOURCE, df's Filesystem. mount(8) compares it
// with an fstab line's source to tell whether the line is mounted, so the
// helper passes the line's SOURCE as --source, and `mount -a` run again
// leaves the mount alone. A path is shown resolved (absolute, symlinks
// followed), as mount(8) resolves the fstab side before it compares.
//
// Without --source it is the data directory when a tier lives there, and
// otherwise the kv engine's name (the large one's with --kv none): engine
// names are what logs and errors show, user@host:port/database for
// PostgreSQL, never a password.
func (a *app) mountSource(st *store.Store, given string) string {
	switch {
	case given != "" && !filepath.IsAbs(given):
		return given
	case given != "":
		return resolvePath(given)
	case a.inData && a.data != "":
		return resolvePath(a.data)
	}
	if kv, large := st.EngineNames(); kv != "" {
		return kv
	} else if large != "" {
		return large
	}
	return "alkblobfs"
}

// checkSource refuses a --source that mount(2) or mountinfo could not
// carry as one field.
func checkSource(s string) error {
	if s == "" {
		return fmt.Errorf("--source is empty")
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return fmt.Errorf("--source %q: no control characters", s)
	}
	return nil
}

// resolvePath is p absolute with its symlinks followed, as far as it
// exists.
func resolvePath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		p = real
	}
	return p
}
