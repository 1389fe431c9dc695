package namespaces

import "fmt"

// MaxNameLen is the longest namespace name in bytes: NAME_MAX on Linux,
// since a namespace is a directory at the mount root.
const MaxNameLen = 255

// ValidName checks the namespace name rules (docs/cli.md, "Namespaces and sweeps"): 1–255 bytes of
// [A-Za-z0-9._-], not starting with '.'. The dot rule keeps ".", ".." and
// the mount's reserved ".alkblobfs" out of the namespace space; the
// character set keeps names safe in paths, URLs and shell scripts. A
// violation returns an error wrapping ErrBadName.
//
// Every registry entry point calls it before touching state.
func ValidName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrBadName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrBadName, len(name), MaxNameLen)
	case name[0] == '.':
		return fmt.Errorf("%w: starts with '.'", ErrBadName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: byte %#02x at offset %d: allowed are A-Z a-z 0-9 . _ -", ErrBadName, c, i)
		}
	}
	return nil
}
