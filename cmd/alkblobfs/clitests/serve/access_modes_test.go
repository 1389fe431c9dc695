//go:build linux

package serve

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestHTTPAccessModes: for a sample of namespace modes — none, all, each
// bit alone, mixes, sticky — every route gives the owner, a member of the group
// (by a supplementary group), anyone else and root the answer
// namespaces.Allowed decides, through the mount, on the Unix socket and
// on TCP with the user's token: one mount and one server for all of them,
// so that a mode the surfaces see differently cannot pass (issue 35: a
// chmod 000 namespace answered 403 over HTTP and was open on the mount).
func TestHTTPAccessModes(t *testing.T) {
	t.Parallel()
	f := newAccessFixture(t)
	asRoot := func(s string) (string, error) {
		out, err := exec.Command("sh", "-c", s).CombinedOutput()
		return string(out), err
	}
	users := []struct {
		name string
		sh   func(string) (string, error)
		p    namespaces.Principal
	}{
		{"owner", f.alice.Sh, namespaces.Principal{UID: f.alice.UID, GIDs: []uint32{f.alice.GID}}},
		{"group member", f.carol.Sh, namespaces.Principal{UID: f.carol.UID, GIDs: []uint32{f.carol.GID, f.alice.GID}}},
		{"other", f.bob.Sh, namespaces.Principal{UID: f.bob.UID, GIDs: []uint32{f.bob.GID}}},
		{"root", asRoot, namespaces.Root},
	}
	// rule is what Allowed decides for op; the digest read is linked by
	// namespace a alone, so a read naming no namespace needs x on a.
	rule := func(p namespaces.Perm, who namespaces.Principal, op httpOp) bool {
		switch op.name {
		case "delete-from-store":
			return who.UID == 0 // root, the server's own user here
		case "put":
			return namespaces.Allowed(p, who, namespaces.Write|namespaces.Search) == nil
		case "unlink":
			return namespaces.Allowed(p, who, namespaces.Remove) == nil
		}
		return namespaces.Allowed(p, who, namespaces.Search) == nil
	}
	// Sticky: only the namespace's owner (and root) removes a reference.
	sample := []uint32{0, 0o777, 0o700, 0o750, 0o755, 0o711, 0o705, 0o730, 0o070, 0o007, 0o333, 0o555, 0o666, 0o1777, 0o1770}
	for bit := range 9 {
		sample = append(sample, 1<<bit)
	}
	cells := 0
	for _, mode := range sample {
		sh(t, fmt.Sprintf("chmod %04o %s/a", mode, f.mnt))
		p := namespaces.Perm{Uid: f.alice.UID, Gid: f.alice.GID, Mode: mode}
		// The blob each cell removes, put by root through the mount.
		rm := func(u, via string) string { return hexSum(fmt.Sprintf("rm %04o %s %s", mode, u, via)) }
		var mk strings.Builder
		for _, u := range users {
			for _, via := range []string{"mount", "unix", "tcp"} {
				fmt.Fprintf(&mk, "printf %%s 'rm %04o %s %s' > '%s/a/incoming/%s'\n", mode, u.name, via, f.mnt, rm(u.name, via)[:16])
			}
		}
		sh(t, mk.String())

		for _, u := range users {
			var mount, unix strings.Builder
			for _, op := range httpOps {
				cell := fmt.Sprintf("%04o-%d-%s", mode, u.p.UID, op.name)
				line := "false"
				if op.mount != "" {
					line = fmt.Sprintf(op.mount, f.mnt, f.d, rm(u.name, "mount"), "m"+cell)
				} else if u.p.UID == 0 {
					line = "true" // alkblobfs rm, with the data directory
				}
				fmt.Fprintf(&mount, "if ( %s ) >/dev/null 2>&1; then echo 1; else echo 0; fi\n", line)
				method, path, body := op.request(f.d, rm(u.name, "unix"), "u"+cell)
				unix.WriteString(curlStatusLine(f.sock, method, path, body))
			}
			mOut, _ := u.sh(mount.String())
			uOut, err := u.sh(unix.String())
			mGot, uGot := strings.Fields(mOut), strings.Fields(uOut)
			if len(mGot) != len(httpOps) || err != nil || len(uGot) != len(httpOps) {
				t.Fatalf("mode %04o, %s: the mount printed %q, the socket %v %q", mode, u.name, mOut, err, uOut)
			}
			for i, op := range httpOps {
				want := rule(p, u.p, op)
				status := op.denied
				if want {
					status = successOf(op)
				}
				cells += 2
				if got := mGot[i] == "1"; got != want {
					t.Errorf("mode %04o, %s, %s: through the mount %v, by namespaces.Allowed %v", mode, u.name, op.name, got, want)
				}
				if uGot[i] != fmt.Sprint(status) {
					t.Errorf("mode %04o, %s, %s: the Unix socket answers %s; namespaces.Allowed says %v (%d)", mode, u.name, op.name, uGot[i], want, status)
				}
				tok, ok := f.tokens[u.name]
				if !ok {
					continue // root has no token
				}
				method, path, body := op.request(f.d, rm(u.name, "tcp"), fmt.Sprintf("t%04o-%s-%s", mode, u.name, op.name))
				got, b := f.do(t, method, path, body, tok)
				cells++
				if got != status {
					t.Errorf("mode %04o, %s, %s: TCP answers %d %s; namespaces.Allowed says %v (%d)", mode, u.name, op.name, got, b, want, status)
				}
			}
		}
	}
	t.Logf("%d cells over %d modes, each as namespaces.Allowed decides", cells, len(sample))
}
