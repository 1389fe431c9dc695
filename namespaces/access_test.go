package namespaces_test

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

const (
	owner, member, other = 1000, 1001, 1002 // uids
	group, elsewhere     = 500, 501         // gids
)

var (
	asOwner = namespaces.Principal{UID: owner, GIDs: []uint32{owner}}
	// asMember is in the namespace's group by a supplementary group.
	asMember = namespaces.Principal{UID: member, GIDs: []uint32{member, elsewhere, group}}
	// asPrimary is in it by its primary group.
	asPrimary = namespaces.Principal{UID: member, GIDs: []uint32{group}}
	asOther   = namespaces.Principal{UID: other, GIDs: []uint32{other, elsewhere}}
	// asRootGroup is in root's group but is not root.
	asRootGroup = namespaces.Principal{UID: other, GIDs: []uint32{0}}
)

// TestAllowed: every mode bit, for the owner, a member of the group by its
// primary or a supplementary group, anyone else, and root.
func TestAllowed(t *testing.T) {
	all := []namespaces.Access{namespaces.Read, namespaces.Write, namespaces.Search}
	for bit := range 9 {
		mode := uint32(1) << bit
		p := namespaces.Perm{Uid: owner, Gid: group, Mode: mode}
		// The bit grants one Access to one class.
		grants := namespaces.Access(1 << (bit % 3))
		var class string
		switch bit / 3 {
		case 2:
			class = "owner"
		case 1:
			class = "group"
		default:
			class = "other"
		}
		for _, who := range []struct {
			name  string
			p     namespaces.Principal
			class string
		}{
			{"owner", asOwner, "owner"},
			{"supplementary member", asMember, "group"},
			{"primary member", asPrimary, "group"},
			{"other", asOther, "other"},
			{"root's group", asRootGroup, "other"},
			{"root", namespaces.Root, "root"},
		} {
			for _, want := range all {
				ok := who.class == "root" || who.class == class && want == grants
				err := namespaces.Allowed(p, who.p, want)
				if ok != (err == nil) {
					t.Errorf("mode %04o, %s wants %s: %v; want allowed %v", mode, who.name, want, err, ok)
				}
				if err != nil && !errors.Is(err, namespaces.ErrDenied) {
					t.Errorf("mode %04o, %s wants %s: %v does not wrap ErrDenied", mode, who.name, want, err)
				}
			}
		}
	}
}

// TestAllowedEveryMode: every mode from 0000 to 0777 (and each with the
// set-id and sticky bits added, which change nothing), every principal
// class and every Access, against the rule read off the mode as ls shows
// it: the class's three letters, r, w and x, each granting its own
// Access. A mode a surface could see differently from the rule cannot
// pass (fusefs's TestAccessTable checks the kernel's answers against
// Allowed for the same 512 modes).
func TestAllowedEveryMode(t *testing.T) {
	classes := []struct {
		name  string
		p     namespaces.Principal
		class int // index into "rwxrwxrwx" / 3; -1: root
	}{
		{"owner", asOwner, 0},
		{"owner also in the group", namespaces.Principal{UID: owner, GIDs: []uint32{group}}, 0},
		{"supplementary member", asMember, 1},
		{"primary member", asPrimary, 1},
		{"other", asOther, 2},
		{"root's group", asRootGroup, 2},
		{"root", namespaces.Root, -1},
	}
	letters := []struct {
		c byte
		a namespaces.Access
	}{{'r', namespaces.Read}, {'w', namespaces.Write}, {'x', namespaces.Search}}
	n := 0
	for mode := range uint32(0o1000) {
		ls := fs.FileMode(mode).Perm().String()[1:] // "rwxr-x---"
		for _, extra := range []uint32{0, 0o1000, 0o2000, 0o4000, 0o7000} {
			p := namespaces.Perm{Uid: owner, Gid: group, Mode: mode | extra}
			for _, c := range classes {
				for want := namespaces.Access(1); want <= namespaces.Read|namespaces.Write|namespaces.Search; want++ {
					ok := true
					if c.class >= 0 {
						for _, l := range letters {
							if want&l.a != 0 && ls[3*c.class+strings.IndexByte("rwx", l.c)] != l.c {
								ok = false
							}
						}
					}
					err := namespaces.Allowed(p, c.p, want)
					if (err == nil) != ok {
						t.Errorf("mode %04o (%s), %s wants %s: %v; want allowed %v", p.Mode, ls, c.name, want, err, ok)
					}
					if err != nil && !errors.Is(err, namespaces.ErrDenied) {
						t.Errorf("mode %04o, %s wants %s: %v does not wrap ErrDenied", p.Mode, c.name, want, err)
					}
					n++
				}
				// Remove: w and x, and the owner's alone where the
				// sticky bit is set.
				ok := c.class < 0 || ls[3*c.class+1] == 'w' && ls[3*c.class+2] == 'x' && (extra&0o1000 == 0 || c.class == 0 && c.p.UID == owner)
				if err := namespaces.Allowed(p, c.p, namespaces.Remove); (err == nil) != ok {
					t.Errorf("mode %04o (%s), %s removes a reference: %v; want allowed %v", p.Mode, ls, c.name, err, ok)
				}
			}
		}
	}
	if n != 512*5*len(classes)*7 {
		t.Fatalf("%d cells", n)
	}
}

// TestAllowedClasses: one class applies, the first that fits, and every
// bit wanted must be granted.
func TestAllowedClasses(t *testing.T) {
	rwx := namespaces.Read | namespaces.Write | namespaces.Search
	wx := namespaces.Write | namespaces.Search
	for _, c := range []struct {
		mode uint32
		who  namespaces.Principal
		want namespaces.Access
		ok   bool
	}{
		{0o077, asOwner, namespaces.Read, false},                           // the owner's bits, though the others grant it
		{0o707, asMember, namespaces.Read, false},                          // the group's bits, though the others grant it
		{0o707, asPrimary, namespaces.Read, false},                         // likewise, by the primary group
		{0o750, asOther, namespaces.Read, false},                           // the case of TestAccessControl
		{0o755, asOther, wx, false},                                        // put into a 0755 namespace
		{0o755, asOther, namespaces.Read, true},                            // list it
		{0o711, asOther, namespaces.Search, true},                          // read a blob by digest, not list
		{0o711, asOther, namespaces.Read, false},                           //
		{0o730, asMember, wx, true},                                        // a drop box for the group
		{0o730, asMember, namespaces.Read, false},                          //
		{0o700, asOwner, rwx, true},                                        //
		{0o600, asOwner, wx, false},                                        // w without x
		{0o000, namespaces.Root, rwx, true},                                // root
		{0o7777, asOther, rwx, true},                                       // set-id and sticky bits change nothing
		{0o7000, asOther, namespaces.Search, false},                        //
		{0o755, namespaces.Principal{UID: other}, namespaces.Search, true}, // no groups at all
		{0o1777, asOther, wx, true},                                        // put into a sticky namespace
		{0o1777, asOther, namespaces.Remove, false},                        // but not remove a reference
		{0o1770, asMember, namespaces.Remove, false},                       //
		{0o1700, asOwner, namespaces.Remove, true},                         // its owner may
		{0o1000, namespaces.Root, namespaces.Remove, true},                 // and root
		{0o777, asOther, namespaces.Remove, true},                          // without the bit, w and x suffice
		{0o1755, asOwner, namespaces.Remove, true},                         //
	} {
		p := namespaces.Perm{Uid: owner, Gid: group, Mode: c.mode}
		err := namespaces.Allowed(p, c.who, c.want)
		if (err == nil) != c.ok {
			t.Errorf("mode %04o, uid %d groups %v wants %s: %v; want allowed %v", c.mode, c.who.UID, c.who.GIDs, c.want, err, c.ok)
		}
	}
	if err := namespaces.Allowed(namespaces.Perm{Mode: 0o777}, asOwner, 0o10); err == nil || errors.Is(err, namespaces.ErrDenied) {
		t.Errorf("a want that is no Access: %v; want an error other than ErrDenied", err)
	}
}

// TestChangePerm: root changes anything; the owner the mode, and the group
// to one of its own; nobody else anything, nobody but root the owner.
func TestChangePerm(t *testing.T) {
	p := namespaces.Perm{Uid: owner, Gid: group, Mode: 0o750}
	mode := func(m uint32) namespaces.PermChange { return namespaces.PermChange{Mode: m, SetMode: true} }
	uid := func(u uint32) namespaces.PermChange { return namespaces.PermChange{UID: u, SetUID: true} }
	gid := func(g uint32) namespaces.PermChange { return namespaces.PermChange{GID: g, SetGID: true} }
	ownerIn := namespaces.Principal{UID: owner, GIDs: []uint32{owner, elsewhere}}
	for _, c := range []struct {
		who    namespaces.Principal
		change namespaces.PermChange
		want   *namespaces.Perm // nil: ErrNotOwner
	}{
		{asOwner, mode(0o10755), &namespaces.Perm{Uid: owner, Gid: group, Mode: 0o755}}, // type bits dropped
		{asOwner, mode(0o2770), &namespaces.Perm{Uid: owner, Gid: group, Mode: 0o2770}},
		{asOwner, uid(owner), &p},      // chown to itself
		{asOwner, gid(group), &p},      // chgrp to the group it has, though not in it
		{asOwner, uid(other), nil},     // give it away
		{asOwner, gid(elsewhere), nil}, // to a group it is not in
		{ownerIn, gid(elsewhere), &namespaces.Perm{Uid: owner, Gid: elsewhere, Mode: 0o750}},
		{asOther, namespaces.PermChange{}, &p}, // nothing set
		{asOther, mode(0o750), nil},            // even to the same mode
		{asMember, mode(0o770), nil},
		{asRootGroup, gid(0), nil},
		{namespaces.Root, uid(other), &namespaces.Perm{Uid: other, Gid: group, Mode: 0o750}},
		{namespaces.Root, namespaces.PermChange{Mode: 0o700, UID: other, GID: 7, SetMode: true, SetUID: true, SetGID: true},
			&namespaces.Perm{Uid: other, Gid: 7, Mode: 0o700}},
	} {
		got, err := namespaces.ChangePerm(p, c.who, c.change)
		name := fmt.Sprintf("uid %d groups %v changes %+v", c.who.UID, c.who.GIDs, c.change)
		switch {
		case c.want == nil && !errors.Is(err, namespaces.ErrNotOwner):
			t.Errorf("%s: %v; want ErrNotOwner", name, err)
		case c.want == nil && got != p:
			t.Errorf("%s: refused, but returned %+v", name, got)
		case c.want != nil && (err != nil || got != *c.want):
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, *c.want)
		}
	}
}

// TestAllowedQuota: root and the store's owner may set quotas; nobody
// else, not even a namespace's own owner, and the refusal is EPERM's.
func TestAllowedQuota(t *testing.T) {
	const owner = 1000
	for _, tc := range []struct {
		who namespaces.Principal
		ok  bool
	}{
		{namespaces.Root, true},
		{namespaces.Principal{UID: owner, GIDs: []uint32{owner}}, true},
		{namespaces.Principal{UID: 1001, GIDs: []uint32{0, owner}}, false},
		{namespaces.Principal{UID: 65534, GIDs: []uint32{65534}}, false},
	} {
		err := namespaces.AllowedQuota(tc.who, owner)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, namespaces.ErrNotOwner) {
			t.Errorf("AllowedQuota(%+v, store owner %d) = %v; want allowed %v", tc.who, owner, err, tc.ok)
		}
	}
}
