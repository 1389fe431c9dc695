package ops_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/client"
	"github.com/alkblobfs/alkblobfs/ops"
)

// Two users' tokens, uids 1001 and 1002, with no passwd entries.
const (
	aliceTok = "alice-token-0123456789"
	bobTok   = "bob-token-0123456789ab"
)

func twoUsers(t *testing.T) *ops.Tokens {
	t.Helper()
	toks, err := ops.ParseTokens(strings.NewReader(aliceTok+" 1001\n"+bobTok+" 1002\n"), func(s string) (uint32, error) {
		var n uint32
		_, err := fmt.Sscan(s, &n)
		return n, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// serveTCP serves srv on a loopback TCP port, tokens required, until t
// ends, and returns its URL.
func serveTCP(t *testing.T, srv *ops.Server) string {
	t.Helper()
	ln, err := ops.Listen("127.0.0.1:0", ops.ListenConfig{Tokens: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	return "http://" + ln.Addr().String()
}

// serveBounded runs a server over e's store on loopback with cfg's bounds
// and the two users' tokens; the namespace "builds" is everyone's (0777).
func serveBounded(t *testing.T, e *env, cfg ops.Config) (*ops.Server, string) {
	t.Helper()
	cfg.Store, cfg.Namespaces, cfg.Tokens = e.st, e.svc, twoUsers(t)
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv := ops.New(cfg)
	url := serveTCP(t, srv)
	p, _, _ := e.svc.Perm(t.Context(), "builds")
	p.Mode = 0o777
	if err := e.svc.SetPerm(t.Context(), "builds", p); err != nil {
		t.Fatal(err)
	}
	return srv, url
}

// slowPut starts a put of size bytes as tok, sends sent of them and
// stalls; the returned conn is the client's end.
func slowPut(t *testing.T, url, tok string, size, sent int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/blobs?namespace=builds HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", tok, size)
	c.Write(bytes.Repeat([]byte("s"), sent))
	return c
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSlowloris: an upload that stops sending is cut at BodyTimeout and
// its memory given back; headers that never end are cut at
// ReadHeaderTimeout.
func TestSlowloris(t *testing.T) {
	e := newEnv(t, envOptions{})
	const body = 400 * time.Millisecond
	th := e.st.Threshold()
	srv, url := serveBounded(t, e, ops.Config{BodyTimeout: body, ReadHeaderTimeout: body})

	start := time.Now()
	c := slowPut(t, url, aliceTok, int(th), 10)
	waitFor(t, "the upload to hold memory", 5*time.Second, func() bool { return srv.MemoryHeld() == th })
	// The server cuts it: a 400 answer or a closed connection, not before
	// BodyTimeout and well within a few.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, c)
	if el := time.Since(start); el < body || el > 10*time.Second {
		t.Fatalf("the stalled upload was cut after %s; want about %s", el, body)
	}
	waitFor(t, "the upload's memory to be given back", 10*time.Second, func() bool { return srv.MemoryHeld() == 0 })

	// Headers that never end. The server's clock for them starts when it
	// accepts the connection, which may be before Dial returns: timed from
	// before the dial.
	start = time.Now()
	h, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	fmt.Fprintf(h, "GET /metrics HTTP/1.1\r\nHost: x\r\n")
	h.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, h)
	if el := time.Since(start); el < body || el > 10*time.Second {
		t.Fatalf("unfinished headers were cut after %s; want about %s", el, body)
	}
}

// TestMemoryShares: while alice's stalled uploads would fill the whole
// upload memory, they hold only her share of it, and bob's put goes
// through at once.
func TestMemoryShares(t *testing.T) {
	e := newEnv(t, envOptions{})
	th := e.st.Threshold()
	srv, url := serveBounded(t, e, ops.Config{Memory: 4 * th, MemoryShare: th})
	for range 4 {
		slowPut(t, url, aliceTok, int(th), 10)
	}
	waitFor(t, "alice's uploads to hold memory", 5*time.Second, func() bool { return srv.MemoryHeld() >= th })
	bc, _ := client.New(url, bobTok)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, _, err := bc.Put(ctx, "builds", bytes.NewReader(make([]byte, th)), th, nil); err != nil {
		t.Fatalf("bob's put while alice's uploads stall: %v (alice holds %d of %d bytes)", err, srv.MemoryHeld(), 4*th)
	}
	if held := srv.MemoryHeld(); held != th {
		t.Fatalf("alice's four uploads hold %d bytes; want her share, %d", held, th)
	}
}

// TestTokenBound: a principal holds at most MaxTokens live pin tokens; the
// next put is 429 and stores nothing, another principal is not affected,
// and a release makes room.
func TestTokenBound(t *testing.T) {
	e := newEnv(t, envOptions{})
	_, url := serveBounded(t, e, ops.Config{MaxTokens: 2})
	ac, _ := client.New(url, aliceTok)
	bc, _ := client.New(url, bobTok)
	var toks []string
	for i := range 2 {
		_, tok, err := ac.Put(t.Context(), "builds", strings.NewReader(fmt.Sprint("a", i)), 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	req, _ := http.NewRequest("POST", url+"/v1/blobs?namespace=builds", strings.NewReader("third"))
	req.Header.Set("Authorization", "Bearer "+aliceTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !bytes.Contains(b, []byte(`"code":"too_many"`)) {
		t.Fatalf("alice's third put: %d %s; want 429", resp.StatusCode, b)
	}
	if has, _ := e.svc.HasMany(t.Context(), "builds", []blob.Digest{blob.Sum([]byte("third"))}); has[0] {
		t.Fatal("the refused put was stored")
	}
	if _, _, err := bc.Put(t.Context(), "builds", strings.NewReader("bob's"), 5, nil); err != nil {
		t.Fatalf("bob's put beside alice's bound: %v", err)
	}
	// bob cannot release alice's token; alice can, and then puts again.
	if err := bc.Release(t.Context(), toks[0]); err == nil {
		t.Fatal("bob released alice's pin token")
	}
	if err := ac.Release(t.Context(), toks[0]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ac.Put(t.Context(), "builds", strings.NewReader("third"), 5, nil); err != nil {
		t.Fatalf("alice's put after a release: %v", err)
	}
}

// TestTokenFile: the format, its refusals, and the file's mode.
func TestTokenFile(t *testing.T) {
	uid := func(s string) (uint32, error) {
		if s == "nobody-here" {
			return 0, fmt.Errorf("no user %q", s)
		}
		return 7, nil
	}
	for _, tc := range []struct{ name, file, want string }{
		{"alone (the old format)", "0123456789abcdef\n", "needs the user"},
		{"short", "short 7\n", "at least 16"},
		{"unknown user", "0123456789abcdef nobody-here\n", "no user"},
		{"bad verb", "0123456789abcdef 7 verbs=read,fly\n", `"fly"`},
		{"bad namespace", "0123456789abcdef 7 namespaces=.hidden\n", "namespaces="},
		{"unknown option", "0123456789abcdef 7 colour=red\n", "colour"},
		{"twice", "0123456789abcdef 7\n0123456789abcdef 8\n", "same token as line 1"},
		{"empty", "# nothing\n\n", "no tokens"},
	} {
		_, err := ops.ParseTokens(strings.NewReader(tc.file), uid)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("%s: %v; want an error saying %q, naming no token", tc.name, err, tc.want)
		}
	}
	good := "# tokens\n0123456789abcdef 7 namespaces=a,b verbs=read\nfedcba9876543210 7\n"
	if toks, err := ops.ParseTokens(strings.NewReader(good), uid); err != nil || toks.Len() != 2 {
		t.Fatalf("a good file: %v", err)
	}
	file := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(file, []byte("0123456789abcdef 0\n"), 0o640)
	if _, err := ops.ReadTokenFile(file); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a token file others may read: %v", err)
	}
	os.Chmod(file, 0o600)
	if _, err := ops.ReadTokenFile(file); err != nil {
		t.Fatal(err)
	}
	// A client sends the first token of such a file.
	if tok, err := ops.ReadAuthToken(file); err != nil || tok != "0123456789abcdef" {
		t.Fatalf("ReadAuthToken: %q %v", tok, err)
	}
}

// TestPermCache: a chmod (SetPerm, as a mount records it) is enforced
// over HTTP within PermTTL.
func TestPermCache(t *testing.T) {
	e := newEnv(t, envOptions{})
	const ttl = 200 * time.Millisecond
	_, url := serveBounded(t, e, ops.Config{PermTTL: ttl})
	d, _ := e.put(t, "builds", []byte("cached"))
	get := func() int {
		req, _ := http.NewRequest("GET", url+"/v1/blobs/"+d.String()+"?namespace=builds", nil)
		req.Header.Set("Authorization", "Bearer "+bobTok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := get(); s != http.StatusOK {
		t.Fatalf("bob's GET of a 0777 namespace: %d", s)
	}
	p, _, _ := e.svc.Perm(t.Context(), "builds")
	p.Mode = 0o700
	if err := e.svc.SetPerm(t.Context(), "builds", p); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "the chmod to be enforced", 5*time.Second, func() bool { return get() == http.StatusForbidden })
	if el := time.Since(start); el > ttl+time.Second {
		t.Fatalf("the chmod was enforced after %s; PermTTL is %s", el, ttl)
	}
}

// TestDefaultSocket: under $XDG_RUNTIME_DIR when set, else in /run.
func TestDefaultSocket(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1234")
	if got := ops.DefaultSocket(); got != "/run/user/1234/alkblobfs/http.sock" {
		t.Errorf("with XDG_RUNTIME_DIR: %s", got)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	if got := ops.DefaultSocket(); got != "/run/alkblobfs/http.sock" {
		t.Errorf("without XDG_RUNTIME_DIR: %s", got)
	}
}

// TestDocumentedDefaults: the bounds docs/http.md ("Bounds") and docs/security.md state.
func TestDocumentedDefaults(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"ReadHeaderTimeout", ops.DefaultReadHeaderTimeout, 10 * time.Second},
		{"BodyTimeout", ops.DefaultBodyTimeout, 30 * time.Second},
		{"IdleTimeout", ops.DefaultIdleTimeout, 120 * time.Second},
		{"PermTTL", ops.DefaultPermTTL, 250 * time.Millisecond},
	} {
		if c.got != c.want {
			t.Errorf("%s is %s; the docs say %s", c.name, c.got, c.want)
		}
	}
	if ops.DefaultMaxTokens != 65536 {
		t.Errorf("DefaultMaxTokens is %d; the docs say 65 536", ops.DefaultMaxTokens)
	}
}
