//go:build linux

package serve

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/client"
	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// The HTTP surface against the mount, side by side, on one store: a mount
// with --allow-other serving the Unix socket, and a serve process on TCP
// with a token file, over the same data directory. Each cell of the
// matrix is an operation by a principal on a namespace of one mode; the
// HTTP answer must be what the mount answers the same user for the same
// operation (further limited by a token's namespaces and verbs).

// httpOp is one operation, through the mount (a shell line that succeeds
// or fails) and over HTTP.
type httpOp struct {
	name string
	verb string // the token verb it needs
	// denied is the HTTP status of a refusal: 403, or 404 for a digest
	// read that names no namespace (which must not say whether the blob
	// exists).
	denied int
	// mount is the shell line run as the user (%[1]s the mountpoint,
	// %[2]s the digest read, %[3]s the blob this cell removes, %[4]s a
	// name unique to the cell); "" means no mount operation: refused to
	// every user but root.
	mount string
}

var httpOps = []httpOp{
	{"get", "read", 403, "cat %[1]s/a/%[2]s"},
	{"head", "read", 403, "cat %[1]s/a/%[2]s"},
	{"get-no-namespace", "read", 404, "cat %[1]s/a/%[2]s"},
	{"have", "read", 403, "test -e %[1]s/a/%[2]s"},
	{"put", "write", 403, "printf %%s %[4]s > %[1]s/a/incoming/%[4]s"},
	{"unlink", "delete", 403, "rm %[1]s/a/%[3]s"},
	// Deleting from the store is alkblobfs rm's: it needs the data
	// directory, which only its owner (and root) opens.
	{"delete-from-store", "delete", 403, ""},
}

// request is an operation's HTTP request for the cell: method, path and
// query, body.
func (o httpOp) request(d, rm, cell string) (string, string, string) {
	switch o.name {
	case "get":
		return "GET", "/v1/blobs/" + d + "?namespace=a", ""
	case "head":
		return "HEAD", "/v1/blobs/" + d + "?namespace=a", ""
	case "get-no-namespace":
		return "GET", "/v1/blobs/" + d, ""
	case "have":
		return "POST", "/v1/blobs/have", `{"namespace":"a","digests":["` + d + `"]}`
	case "put":
		return "POST", "/v1/blobs?namespace=a", cell
	case "unlink":
		return "DELETE", "/v1/blobs/" + rm + "?namespace=a", ""
	case "delete-from-store":
		return "DELETE", "/v1/blobs/" + rm, ""
	}
	panic(o.name)
}

// accessFixture is one store, one mount, one server and three users.
type accessFixture struct {
	c                 *clitest.CLI
	mnt, sock, url    string
	alice, carol, bob fusetest.User
	d                 string // a blob of namespace a
	secret            string // a blob of namespace z, which no cell asks for
	tokens            map[string]string
	leaks             []string // what no error body may contain
}

func newAccessFixture(t *testing.T) *accessFixture {
	clitest.RequireFUSE(t)
	f := &accessFixture{c: clitest.NewCLI(t)}
	f.alice, f.carol, f.bob = fusetest.NewUser(t), fusetest.NewUser(t), fusetest.NewUser(t)
	// carol is in alice's group by a supplementary group alone.
	if out, err := exec.Command("usermod", "-a", "-G", f.alice.Name, f.carol.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	f.mnt = t.TempDir()
	f.sock = filepath.Join(t.TempDir(), "http.sock")
	fusetest.Reachable(t, filepath.Dir(f.sock))
	fusetest.Reachable(t, f.mnt)
	clitest.StartDaemon(t, f.c.Data, f.mnt, "--allow-other", "--listen", "unix:"+f.sock, "--perm-cache", "-1s")
	clitest.Eventually(t, 10*time.Second, "the Unix socket", func() bool { _, err := os.Stat(f.sock); return err == nil })

	f.tokens = map[string]string{}
	var lines strings.Builder
	for _, tk := range []struct{ name, user, opts string }{
		{"owner", f.alice.Name, ""},
		{"group member", f.carol.Name, ""},
		{"other", fmt.Sprint(f.bob.UID), ""},
		{"token bound to another namespace", f.alice.Name, "namespaces=z"},
		{"read-only token", f.alice.Name, "verbs=read"},
	} {
		tok := fmt.Sprintf("%x", sha256.Sum256([]byte(tk.name+f.mnt)))[:32]
		f.tokens[tk.name] = tok
		fmt.Fprintf(&lines, "%s %s %s\n", tok, tk.user, tk.opts)
	}
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("# the matrix's tokens\n"+lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	s := clitest.StartServe(t, f.c, "--listen", "127.0.0.1:0", "--auth-token-file", file, "--perm-cache", "-1s")
	f.url = s.URL

	sh(t, fmt.Sprintf("mkdir %[1]s/a %[1]s/z && chown %[2]d:%[3]d %[1]s/a %[1]s/z && printf 'alice only' > %[1]s/a/incoming/f && printf 'z only' > %[1]s/z/incoming/f",
		f.mnt, f.alice.UID, f.alice.GID))
	f.d, f.secret = hexSum("alice only"), hexSum("z only")
	f.leaks = []string{f.c.Data, f.mnt, f.sock, file, "sqlite:", "postgres://", "kv.db", f.secret}
	return f
}

func hexSum(s string) string { b := sha256.Sum256([]byte(s)); return hex.EncodeToString(b[:]) }

func sh(t *testing.T, script string) {
	t.Helper()
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// do sends one request to the TCP server with token tok ("" none).
func (f *accessFixture) do(t *testing.T, method, path, body, tok string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// checkBody fails t if an error body names any of the fixture's leaks.
func (f *accessFixture) checkBody(t *testing.T, what string, status int, body []byte) {
	t.Helper()
	if status < 400 || strings.HasPrefix(what, "HEAD") { // a HEAD answer has no body
		return
	}
	if !bytes.Contains(body, []byte(`"code":"`)) {
		t.Errorf("%s: error body without a code: %s", what, body)
	}
	for _, l := range f.leaks {
		if bytes.Contains(body, []byte(l)) {
			t.Errorf("%s: the error body names %q: %s", what, l, body)
		}
	}
}

// TestHTTPAccessMatrix: every route × {owner, group member, other, a
// token bound to another namespace, a read-only token, no credentials}
// × modes {0700, 0750, 0755, 0777}, on the Unix socket and on TCP with
// tokens, against what the mount answers the same user.
func TestHTTPAccessMatrix(t *testing.T) {
	t.Parallel()
	f := newAccessFixture(t)
	users := []struct {
		name string
		u    fusetest.User
	}{{"owner", f.alice}, {"group member", f.carol}, {"other", f.bob}}
	// The user each token acts as (no credentials: compared with the
	// owner, though it gets 401 whatever the mount says).
	tokenUser := map[string]string{
		"owner": "owner", "group member": "group member", "other": "other",
		"token bound to another namespace": "owner", "read-only token": "owner", "no credentials": "owner",
	}
	cells := 0
	for _, mode := range []uint32{0o700, 0o750, 0o755, 0o777} {
		sh(t, fmt.Sprintf("chmod %04o %s/a", mode, f.mnt))
		// The blobs each cell removes, put by root.
		rm := map[string]string{}
		var mk strings.Builder
		for _, u := range users {
			for _, via := range []string{"mount", "unix", "tcp"} {
				for _, tn := range append([]string{u.name}, "token bound to another namespace", "read-only token", "no credentials") {
					if via != "tcp" && tn != u.name {
						continue
					}
					key := fmt.Sprintf("rm %04o %s %s %s", mode, u.name, via, tn)
					if via != "tcp" {
						key = fmt.Sprintf("rm %04o %s %s", mode, u.name, via)
					}
					if _, ok := rm[key]; !ok {
						rm[key] = hexSum(key)
						fmt.Fprintf(&mk, "printf %%s '%s' > '%s/a/incoming/%s'\n", key, f.mnt, hexSum(key)[:16])
					}
				}
			}
		}
		sh(t, mk.String())

		// What the mount lets each user do.
		mountOK := map[string][]bool{}
		for _, u := range users {
			var script strings.Builder
			for _, op := range httpOps {
				if op.mount == "" {
					script.WriteString("echo 0\n")
					continue
				}
				cell := fmt.Sprintf("m%04o-%d-%s", mode, u.u.UID, op.name)
				line := fmt.Sprintf(op.mount, f.mnt, f.d, rm[fmt.Sprintf("rm %04o %s mount", mode, u.name)], cell)
				fmt.Fprintf(&script, "if ( %s ) >/dev/null 2>&1; then echo 1; else echo 0; fi\n", line)
			}
			out, _ := u.u.Sh(script.String())
			got := strings.Fields(out)
			if len(got) != len(httpOps) {
				t.Fatalf("mode %04o, %s on the mount: %q", mode, u.name, out)
			}
			for _, g := range got {
				mountOK[u.name] = append(mountOK[u.name], g == "1")
			}
		}

		// The Unix socket: curl as each user.
		for _, u := range users {
			var script strings.Builder
			for _, op := range httpOps {
				method, path, body := op.request(f.d, rm[fmt.Sprintf("rm %04o %s unix", mode, u.name)], fmt.Sprintf("u%04o-%d-%s", mode, u.u.UID, op.name))
				script.WriteString(curlStatusLine(f.sock, method, path, body))
			}
			out, err := u.u.Sh(script.String())
			got := strings.Fields(out)
			if err != nil || len(got) != len(httpOps) {
				t.Fatalf("mode %04o, %s on the socket: %v %q", mode, u.name, err, out)
			}
			for i, op := range httpOps {
				want := op.denied
				if mountOK[u.name][i] {
					want = successOf(op)
				}
				cells++
				if got[i] != fmt.Sprint(want) {
					t.Errorf("mode %04o, %s, %s: the mount says %v; the Unix socket answers %s, want %d",
						mode, u.name, op.name, mountOK[u.name][i], got[i], want)
				}
			}
		}

		// TCP with tokens.
		for _, tn := range []string{"owner", "group member", "other", "token bound to another namespace", "read-only token", "no credentials"} {
			for i, op := range httpOps {
				base := tokenUser[tn]
				key := fmt.Sprintf("rm %04o %s tcp %s", mode, base, tn)
				method, path, body := op.request(f.d, rm[key], fmt.Sprintf("t%04o-%s-%s", mode, tn, op.name))
				status, b := f.do(t, method, path, body, f.tokens[tn])
				f.checkBody(t, fmt.Sprintf("%s %s as %s", method, path, tn), status, b)
				allowed := mountOK[base][i]
				switch {
				case tn == "token bound to another namespace":
					allowed = false
				case tn == "read-only token" && op.verb != "read":
					allowed = false
				}
				want := op.denied
				if allowed {
					want = successOf(op)
				}
				if tn == "no credentials" {
					want = http.StatusUnauthorized
				}
				cells++
				if status != want {
					t.Errorf("mode %04o, %s, %s: the mount says %v for %s; TCP answers %d %s, want %d",
						mode, tn, op.name, mountOK[base][i], base, status, b, want)
				}
			}
		}
	}
	t.Logf("%d cells, each as the mount answers", cells)
}

func successOf(op httpOp) int {
	switch op.name {
	case "put":
		return http.StatusCreated
	case "unlink", "delete-from-store":
		return http.StatusNoContent
	}
	return http.StatusOK
}

// TestHTTPIssue26: the four commands of issue 26, which bob ran against
// alice's 0700 namespace over HTTP, are each refused as the mount refuses
// him; the CLI (--remote unix:PATH), curl and the Go client work on the
// Unix socket for whoever may; a TCP listener beside --allow-other needs
// tokens.
func TestHTTPIssue26(t *testing.T) {
	t.Parallel()
	f := newAccessFixture(t)
	sh(t, fmt.Sprintf("chmod 0700 %s/a", f.mnt))
	fusetest.Reachable(t, clitest.Bin)
	bob := func(script string) string {
		out, _ := f.bob.Sh(script)
		return strings.TrimSpace(out)
	}
	curl := "curl -s --unix-socket " + f.sock + " "
	f.bob.Denied(t, "cat by digest path", fmt.Sprintf("cat %s/a/%s", f.mnt, f.d), "Permission denied")
	for _, c := range []struct{ what, script, want string }{
		{"GET ?namespace=alice's", curl + fmt.Sprintf("-w ' %%{http_code}' 'http://x/v1/blobs/%s?namespace=a'", f.d), `"code":"forbidden"} 403`},
		{"have", curl + fmt.Sprintf(`-w ' %%{http_code}' -X POST -d '{"namespace":"a","digests":["%s"]}' http://x/v1/blobs/have`, f.d), `"code":"forbidden"} 403`},
		{"put into alice's", curl + "-w ' %{http_code}' --data-binary 'planted by bob' 'http://x/v1/blobs?namespace=a'", `"code":"forbidden"} 403`},
		{"DELETE from the store", curl + fmt.Sprintf("-w ' %%{http_code}' -X DELETE http://x/v1/blobs/%s", f.d), `"code":"forbidden"} 403`},
		{"get --remote", clitest.Bin + " --remote unix:" + f.sock + " cat " + f.d + " 2>&1; echo \" $?\"", "(404) 1"},
	} {
		if got := strings.ReplaceAll(bob(c.script), "\n", ""); !strings.HasSuffix(got, c.want) || strings.Contains(got, "alice only") {
			t.Errorf("bob's %s: %q; want it to end %q", c.what, got, c.want)
		}
	}
	if got := f.c.OK("have", "--ns", "a", hexSum("planted by bob")); !strings.Contains(got, "absent") {
		t.Errorf("bob's put is in alice's namespace: %s", got)
	}
	// alice, on the same socket: curl, the CLI.
	if out, err := f.alice.Sh(curl + fmt.Sprintf("'http://x/v1/blobs/%s?namespace=a'", f.d)); err != nil || out != "alice only" {
		t.Errorf("alice's curl: %v %q", err, out)
	}
	if out, err := f.alice.Sh(clitest.Bin + " --remote unix:" + f.sock + " cat " + f.d); err != nil || out != "alice only" {
		t.Errorf("alice's cat --remote: %v %q", err, out)
	}
	// The Go client, as root.
	c, err := client.New("unix:"+f.sock, "")
	if err != nil {
		t.Fatal(err)
	}
	d, tok, err := c.Put(t.Context(), "a", strings.NewReader("by root"), 7, nil)
	if err != nil || d.String() != hexSum("by root") {
		t.Fatalf("client put on the socket: %s %v", d, err)
	}
	// A pin token is its minter's: bob cannot release root's.
	if got := bob(curl + "-w ' %{http_code}' -X DELETE http://x/v1/pins/" + tok); !strings.HasSuffix(got, "404") {
		t.Errorf("bob releasing root's pin token: %q; want 404", got)
	}
	if err := c.Release(t.Context(), tok); err != nil {
		t.Errorf("root releasing its own token: %v", err)
	}

	// The socket is 0666; /metrics answers any caller it accepts, with
	// counts and no digests.
	if fi, err := os.Stat(f.sock); err != nil || fi.Mode().Perm() != 0o666 {
		t.Errorf("the socket: %v, mode %v; want 0666", err, fi.Mode())
	}
	if got := bob(curl + "-w ' %{http_code}' http://x/metrics"); !strings.HasSuffix(got, " 200") || strings.Contains(got, f.d) || !strings.Contains(got, "alkblobfs_puts_total") {
		t.Errorf("bob's /metrics: %.300q", got)
	}

	// --insecure-loopback gives every local user the server's own user:
	// bob reads alice's 0700 namespace through it.
	s := clitest.StartServe(t, f.c, "--listen", "127.0.0.1:0", "--insecure-loopback")
	if got := bob(fmt.Sprintf("curl -s '%s/v1/blobs/%s?namespace=a'", s.URL, f.d)); got != "alice only" {
		t.Errorf("bob through --insecure-loopback (serving as root): %q; want alice's bytes, as docs/http.md warns", got)
	}

	// TCP beside --allow-other: tokens, never --insecure-loopback.
	mnt := t.TempDir()
	r := f.c.Run(nil, "mount", "--allow-other", "--listen", "127.0.0.1:0", "--insecure-loopback", mnt)
	if r.Code != 2 || !strings.Contains(r.Stderr, "--insecure-loopback with --allow-other") {
		t.Errorf("mount --allow-other --insecure-loopback: %d %s", r.Code, r.Stderr)
	}
	r = f.c.Run(nil, "mount", "--allow-other", "--listen", "127.0.0.1:0", mnt)
	if r.Code != 2 || !strings.Contains(r.Stderr, "needs a token file") {
		t.Errorf("mount --allow-other --listen 127.0.0.1:0 without tokens: %d %s", r.Code, r.Stderr)
	}
}

// TestServeDefaultSocket: serve without --listen listens on
// $XDG_RUNTIME_DIR/alkblobfs/http.sock, and the CLI reaches it with
// --remote unix:PATH.
func TestServeDefaultSocket(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	run := t.TempDir()
	c.Env = []string{"XDG_RUNTIME_DIR=" + run}
	s := clitest.StartServeURL(t, c, `url=(unix:\S+)`)
	want := "unix:" + filepath.Join(run, "alkblobfs", "http.sock")
	if s.URL != want {
		t.Fatalf("serve listens at %s; want %s", s.URL, want)
	}
	src, _, digest := clitest.WriteFile(t, t.TempDir(), 5000, 3)
	remote := clitest.NewCLI(t, "--remote", s.URL)
	if got := strings.TrimSpace(remote.OK("put", "--ns", "builds", src)); got != digest {
		t.Fatalf("put --remote %s: %q", s.URL, got)
	}
}

// curlStatusLine is a shell line that sends one request over the Unix
// socket sock and prints its status code alone.
func curlStatusLine(sock, method, path, body string) string {
	flags := "-X " + method
	switch {
	case method == "HEAD":
		flags = "-I"
	case body != "":
		flags += " --data-binary '" + body + "'"
	}
	return fmt.Sprintf("curl -s -o /dev/null -w '%%{http_code}\\n' %s --unix-socket '%s' 'http://x%s'\n", flags, sock, path)
}
