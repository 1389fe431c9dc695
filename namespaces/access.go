package namespaces

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Who may use a namespace is decided here, once, for every surface: the
// namespace's Perm (owner, group, mode) against the caller's uid and
// groups, by the rule the kernel applies to a directory. A mount with
// --allow-other shows each namespace's Perm on its directory and on
// incoming/, and the kernel, asked to check (default_permissions), applies
// this same rule to them before a request reaches the daemon
// (fusefs's TestAccessTable checks that the two agree); an HTTP surface,
// with no kernel in front of it, calls Allowed itself. Changing a Perm
// (chmod, chown, chgrp of the directory) is ChangePerm, which the mount's
// daemon calls itself: without --allow-other no kernel checks it.

// Principal is who asks: a user and the groups it is in.
type Principal struct {
	UID uint32
	// GIDs are all its groups: the primary one and the supplementary
	// ones, in any order.
	GIDs []uint32
}

// Root is the superuser, who may do anything with any namespace.
var Root = Principal{UID: 0, GIDs: []uint32{0}}

func (p Principal) in(gid uint32) bool { return slices.Contains(p.GIDs, gid) }

// Access is what a caller wants of a namespace: bits of the mode class
// that applies to it, as for a directory. Each use of a namespace needs
// these:
//
//	read a blob by its digest, stat it    Search (x)
//	list the namespace                    Read (r)
//	put into it (write into incoming/)    Write|Search (wx)
//	remove a reference (rm)               Remove (wx, and the sticky bit's rule)
type Access uint32

const (
	Search Access = 1 << iota // x: look a digest up
	Write                     // w: link into it, unlink from it
	Read                      // r: list its references
	// sticky: in a namespace with the sticky bit, only its owner (and
	// root) may remove a reference. It is the kernel's rule for a file
	// of another owner in a sticky directory: blob files are the mount's
	// user's, so for every other caller the mount and HTTP answer alike.
	// Its value is the mode's sticky bit.
	sticky Access = 0o1000

	// Remove is what removing a reference needs.
	Remove = Write | Search | sticky
)

func (a Access) String() string {
	var s []string
	for _, b := range []struct {
		bit  Access
		name string
	}{{Read, "read"}, {Write, "write"}, {Search, "search"}, {sticky, "owner if sticky"}} {
		if a&b.bit != 0 {
			s = append(s, b.name)
		}
	}
	if a&^(Read|Write|Search|sticky) != 0 {
		s = append(s, fmt.Sprintf("%#o", uint32(a&^(Read|Write|Search|sticky))))
	}
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, "+")
}

var (
	// ErrDenied: the namespace's mode does not grant the caller what it
	// asks (Allowed). A mount answers EACCES.
	ErrDenied = errors.New("permission denied")
	// ErrNotOwner: a change of a namespace's Perm that only its owner,
	// or only root, may make (ChangePerm). A mount answers EPERM.
	ErrNotOwner = errors.New("operation not permitted: not the namespace's owner")
)

// Allowed returns nil if who may have want of a namespace whose Perm is
// p, and an error wrapping ErrDenied otherwise. The rule is POSIX's for a
// directory: root may do anything; the owner gets the owner's bits, else
// a member of the group (primary or supplementary) the group's, else
// anyone the other bits — only one class applies, so an owner denied by
// the owner's bits is denied even where the other bits grant it; Remove
// in a namespace with the sticky bit is its owner's alone. want with bits
// other than Read, Write, Search and Remove's is an error.
func Allowed(p Perm, who Principal, want Access) error {
	if want&^(Read|Write|Search|sticky) != 0 {
		return wrap("access", "", blob.Digest{}, fmt.Errorf("bad access %s", want))
	}
	if who.UID == 0 {
		return nil
	}
	class := p.Mode
	switch {
	case who.UID == p.Uid:
		class >>= 6
	case who.in(p.Gid):
		class >>= 3
	}
	if Access(class)&want&^sticky != want&^sticky {
		return &Error{Op: "access (" + want.String() + ")", Err: ErrDenied}
	}
	if want&sticky != 0 && p.Mode&uint32(sticky) != 0 && who.UID != p.Uid {
		return &Error{Op: "access (" + want.String() + ") in a sticky namespace of another owner", Err: ErrDenied}
	}
	return nil
}

// PermChange is a chmod, chown or chgrp of a namespace: the fields whose
// Set is true change.
type PermChange struct {
	Mode, UID, GID          uint32
	SetMode, SetUID, SetGID bool
}

// ChangePerm returns p changed by c, if who may change it, and an error
// wrapping ErrNotOwner otherwise. Root may change anything; the owner may
// change the mode, and the group to one of its own groups (or keep it);
// nobody but root gives a namespace to another owner, and nobody but the
// owner and root changes anything. A change that sets nothing is allowed
// to anyone and changes nothing.
func ChangePerm(p Perm, who Principal, c PermChange) (Perm, error) {
	if !c.SetMode && !c.SetUID && !c.SetGID {
		return p, nil
	}
	if who.UID != 0 {
		switch {
		case who.UID != p.Uid:
			return p, &Error{Op: "change owner, group or mode", Err: ErrNotOwner}
		case c.SetUID && c.UID != p.Uid:
			return p, &Error{Op: "change owner", Err: ErrNotOwner}
		case c.SetGID && c.GID != p.Gid && !who.in(c.GID):
			return p, &Error{Op: fmt.Sprintf("change group to %d, not one of the caller's", c.GID), Err: ErrNotOwner}
		}
	}
	if c.SetMode {
		p.Mode = c.Mode
	}
	if c.SetUID {
		p.Uid = c.UID
	}
	if c.SetGID {
		p.Gid = c.GID
	}
	return p.clean(), nil
}
