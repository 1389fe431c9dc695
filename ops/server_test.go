package ops_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/client"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/wire"
)

// env is a store on SQLite + a local directory served by a real listener.
type env struct {
	st    *store.Store
	large engines.Large // under st (nil: kv only), for what a test checks around it
	svc   *namespaces.Service
	srv   *ops.Server
	url   string
	c     *client.Client
	clock *gctest.Clock
	log   *syncBuffer
}

type envOptions struct {
	kvOnly    bool
	authToken string
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	dir := t.TempDir()
	kv, err := sqlite.Open(t.Context(), filepath.Join(dir, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := store.Config{KV: kv, ScratchDir: t.TempDir()}
	if !o.kvOnly {
		l, err := local.Open(t.Context(), filepath.Join(dir, "large"), nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Large = l
	}
	clock := gctest.NewClock()
	cfg.Clock = clock
	st, svc := openStore(t, cfg)
	if err := svc.Create(t.Context(), "builds"); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	srv := ops.New(ops.Config{
		Store: st, Namespaces: svc, Clock: clock, AuthToken: o.authToken, InsecureLoopback: o.authToken == "",
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); srv.Close() })
	c, err := client.New(hs.URL, o.authToken)
	if err != nil {
		t.Fatal(err)
	}
	return &env{st: st, large: cfg.Large, svc: svc, srv: srv, url: hs.URL, c: c, clock: clock, log: logs}
}

// openStore opens a store on cfg (closed when t ends) with a namespaces
// registry in its kv engine registered as its liveness source.
func openStore(t testing.TB, cfg store.Config) (*store.Store, *namespaces.Service) {
	t.Helper()
	st, err := store.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg, err := namespaces.Open(t.Context(), cfg.KV, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Register(reg)
	return st, namespaces.NewService(reg, st)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func randBytes(n int, seed uint64) []byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	b := make([]byte, n)
	rand.NewChaCha8(s).Read(b)
	return b
}

func (e *env) put(t *testing.T, ns string, b []byte) (blob.Digest, string) {
	t.Helper()
	d, tok, err := e.c.Put(t.Context(), ns, bytes.NewReader(b), int64(len(b)), nil)
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	if d != blob.Sum(b) || tok == "" {
		t.Fatalf("put answered %s, token %q; want %s and a token", d, tok, blob.Sum(b))
	}
	return d, tok
}

// sweepAll runs sweeps until the durable window has executed what the
// first one staged (the window's delay is 0).
func (e *env) sweepAll(t *testing.T) {
	t.Helper()
	for range 2 {
		if r, err := e.st.Sweep(t.Context()); err != nil || r.Aborted != "" {
			t.Fatalf("sweep: %+v, %v", r, err)
		}
	}
}

func (e *env) has(t *testing.T, d blob.Digest) bool {
	t.Helper()
	ok, err := e.st.Has(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// request sends a raw request and returns the status and body.
func request(t *testing.T, method, url string, body io.Reader, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func reprDigest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha-256=:" + base64.StdEncoding.EncodeToString(s[:]) + ":"
}

func TestPutHaveGet(t *testing.T) {
	e := newEnv(t, envOptions{})
	small, large := randBytes(1024, 1), randBytes(300<<10, 2)
	ds, _ := e.put(t, "builds", small)
	dl, tok := e.put(t, "builds", large)
	absent := blob.Sum([]byte("never put"))

	got, err := e.c.Have(t.Context(), "builds", []blob.Digest{ds, absent, dl})
	if err != nil || fmt.Sprint(got) != "[true false true]" {
		t.Fatalf("have = %v, %v; want [true false true]", got, err)
	}
	if ok, err := e.c.Renew(t.Context(), "builds", tok, dl); !ok || err != nil {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	if ok, err := e.c.Renew(t.Context(), "builds", tok, ds); ok || err != nil {
		t.Fatalf("renew of a digest the token does not name = %v, %v; want false", ok, err)
	}
	if err := e.svc.Create(t.Context(), "other"); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.c.Renew(t.Context(), "other", tok, dl); ok || err != nil {
		t.Fatalf("renew in a namespace the put did not link into = %v, %v; want false", ok, err)
	}
	if ok, err := e.c.Renew(t.Context(), "gone", tok, dl); ok || err != nil {
		t.Fatalf("renew in an absent namespace = %v, %v; want false and no error", ok, err)
	}
	// The entry is in the namespace, as a mount would list it.
	if _, ok, err := e.svc.Has(t.Context(), "builds", dl); !ok || err != nil {
		t.Fatalf("namespace Has = %v, %v", ok, err)
	}

	for _, b := range [][]byte{small, large} {
		d := blob.Sum(b)
		rc, size, err := e.c.Get(t.Context(), d, "builds")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(body, b) || size != int64(len(b)) {
			t.Fatalf("get %s: %d bytes, size %d, %v", d.Short(), len(body), size, err)
		}
		status, h, _ := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, nil)
		if status != 200 || h.Get("Repr-Digest") != reprDigest(b) || h.Get("ETag") != `"`+d.String()+`"` {
			t.Fatalf("GET: %d, Repr-Digest %q, ETag %q", status, h.Get("Repr-Digest"), h.Get("ETag"))
		}
		status, h, body = request(t, "HEAD", e.url+"/v1/blobs/"+d.String(), nil, nil)
		if status != 200 || h.Get("Content-Length") != fmt.Sprint(len(b)) || len(body) != 0 {
			t.Fatalf("HEAD: %d, Content-Length %q, %d body bytes", status, h.Get("Content-Length"), len(body))
		}
		status, _, body = request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, map[string]string{"If-None-Match": `"` + d.String() + `"`})
		if status != http.StatusNotModified || len(body) != 0 {
			t.Fatalf("If-None-Match: %d, %d body bytes", status, len(body))
		}
	}
	// A namespace that does not hold the blob does not serve it.
	if _, _, err := e.c.Get(t.Context(), ds, "other"); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("get through a namespace without it: %v; want 404", err)
	}
	if _, _, err := e.c.Get(t.Context(), absent, ""); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("get of an absent blob: %v; want 404", err)
	}

	// The empty blob has no range to give: a Range gets the whole (200).
	de, _ := e.put(t, "builds", nil)
	status, h, body := request(t, "GET", e.url+"/v1/blobs/"+de.String(), nil, map[string]string{"Range": "bytes=0-1023"})
	if status != 200 || len(body) != 0 || h.Get("Repr-Digest") != reprDigest(nil) {
		t.Fatalf("ranged GET of the empty blob: %d, %d bytes, %q", status, len(body), h.Get("Repr-Digest"))
	}
	// An unknown endpoint is a JSON 404; errors never carry cache headers.
	status, h, body = request(t, "GET", e.url+"/v2/nothing", nil, nil)
	if status != 404 || !bytes.Contains(body, []byte(`"error"`)) {
		t.Fatalf("unknown endpoint: %d %s", status, body)
	}
	status, h, _ = request(t, "GET", e.url+"/v1/blobs/"+dl.String(), nil, map[string]string{"Range": "bytes=999999999-"})
	if status != http.StatusRequestedRangeNotSatisfiable || h.Get("Cache-Control") != "" || h.Get("ETag") != "" {
		t.Fatalf("416: Cache-Control %q, ETag %q", h.Get("Cache-Control"), h.Get("ETag"))
	}

	// A claimed digest: kept when right, refused (422, nothing stored) when wrong.
	third := randBytes(200<<10, 3)
	want := blob.Sum(third)
	if d, _, err := e.c.Put(t.Context(), "builds", bytes.NewReader(third), -1, &want); err != nil || d != want {
		t.Fatalf("verified put: %s, %v", d, err)
	}
	fourth := randBytes(200<<10, 4)
	if _, _, err := e.c.Put(t.Context(), "builds", bytes.NewReader(fourth), int64(len(fourth)), &want); !errors.Is(err, blob.ErrVerification) {
		t.Fatalf("put with a wrong digest claim: %v; want 422", err)
	}
	if e.has(t, blob.Sum(fourth)) {
		t.Fatal("a refused put stored its content")
	}
	status, _, body = request(t, "POST", e.url+"/v1/blobs?namespace=builds", bytes.NewReader(fourth),
		map[string]string{"X-Alkblobfs-Digest": want.String()})
	if status != http.StatusUnprocessableEntity || !bytes.Contains(body, []byte(`"error"`)) {
		t.Fatalf("X-Alkblobfs-Digest mismatch: %d %s", status, body)
	}
}

// TestPutEveryClaim: a put that carries several digest claims — two
// X-Alkblobfs-Digest lines, a list in one, several sha-256 members of
// Content-Digest, claims in different headers — is stored only if every
// one matches the body; otherwise it is 422 and nothing is stored, not even
// a stage. Algorithms other than sha-256 are ignored (RFC 9530): a field
// with none claims nothing.
func TestPutEveryClaim(t *testing.T) {
	e := newEnv(t, envOptions{})
	b64 := func(d blob.Digest) string { return base64.StdEncoding.EncodeToString(d[:]) }
	sf := func(d blob.Digest) string { return "sha-256=:" + b64(d) + ":" }
	other := blob.Sum([]byte("something else"))
	sha512 := "sha-512=:" + base64.StdEncoding.EncodeToString(make([]byte, 64)) + ":"
	for i, tc := range []struct {
		name   string
		hdr    func(right, wrong blob.Digest) http.Header
		status int
	}{
		{"two X-Alkblobfs-Digest lines", func(r, w blob.Digest) http.Header {
			return http.Header{"X-Alkblobfs-Digest": {r.String(), w.String()}}
		}, 422},
		{"X-Alkblobfs-Digest lines, wrong first", func(r, w blob.Digest) http.Header {
			return http.Header{"X-Alkblobfs-Digest": {w.String(), r.String()}}
		}, 422},
		{"a list in one X-Alkblobfs-Digest", func(r, w blob.Digest) http.Header {
			return http.Header{"X-Alkblobfs-Digest": {r.String() + ", " + w.String()}}
		}, 422},
		{"a list in one Content-Digest", func(r, w blob.Digest) http.Header {
			return http.Header{"Content-Digest": {sf(r) + ", " + sf(w)}}
		}, 422},
		{"two Content-Digest lines", func(r, w blob.Digest) http.Header {
			return http.Header{"Content-Digest": {sf(r), sf(w)}}
		}, 422},
		{"Content-Digest right, X-Alkblobfs-Digest wrong", func(r, w blob.Digest) http.Header {
			return http.Header{"Content-Digest": {sf(r)}, "X-Alkblobfs-Digest": {w.String()}}
		}, 422},
		{"Repr-Digest right, Content-Digest wrong", func(r, w blob.Digest) http.Header {
			return http.Header{"Repr-Digest": {sf(r)}, "Content-Digest": {sha512 + ", " + sf(w)}}
		}, 422},
		{"a list in one Digest (RFC 3230)", func(r, w blob.Digest) http.Header {
			return http.Header{"Digest": {"SHA-256=" + b64(r) + ",SHA-256=" + b64(w)}}
		}, 422},
		{"both wrong, the same", func(r, w blob.Digest) http.Header {
			return http.Header{"X-Alkblobfs-Digest": {w.String() + "," + w.String()}, "Content-Digest": {sf(w)}}
		}, 422},
		{"a malformed entry in the list", func(r, w blob.Digest) http.Header {
			return http.Header{"X-Alkblobfs-Digest": {r.String() + ", not-hex"}}
		}, 400},
		{"a malformed sha-256 member after a right one", func(r, w blob.Digest) http.Header {
			return http.Header{"Content-Digest": {sf(r) + ", sha-256=:AAAA:"}}
		}, 400},
		{"every claim right", func(r, w blob.Digest) http.Header {
			return http.Header{"X-Alkblobfs-Digest": {r.String() + ", " + r.String() + ",", r.String()},
				"Content-Digest": {sha512 + ", " + sf(r), sf(r)}, "Repr-Digest": {sf(r)}, "Digest": {"SHA-256=" + b64(r)}}
		}, 201},
		{"only an algorithm not known", func(r, w blob.Digest) http.Header {
			return http.Header{"Content-Digest": {sha512 + ", md5=:AAAA:"}}
		}, 201},
	} {
		for _, size := range []int{1 << 10, 200 << 10} { // the kv tier, and a stage of the large one
			body := randBytes(size, uint64(100+i))
			right := blob.Sum(body)
			req, err := http.NewRequestWithContext(t.Context(), "POST", e.url+"/v1/blobs?namespace=builds", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header = tc.hdr(right, other)
			before := e.st.Stats()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%s, %d bytes: %d %s; want %d", tc.name, size, resp.StatusCode, msg, tc.status)
			}
			if tc.status == 201 {
				if !e.has(t, right) {
					t.Errorf("%s, %d bytes: answered %d, but the blob is absent", tc.name, size, resp.StatusCode)
				}
				continue
			}
			if !bytes.Contains(msg, []byte(`"error"`)) {
				t.Errorf("%s, %d bytes: no error body: %s", tc.name, size, msg)
			}
			if e.has(t, right) || e.has(t, other) {
				t.Errorf("%s, %d bytes: a refused put stored its content", tc.name, size)
			}
			if got, _ := e.c.Have(t.Context(), "builds", []blob.Digest{right}); got[0] {
				t.Errorf("%s, %d bytes: a refused put linked its content", tc.name, size)
			}
			if st := e.st.Stats(); st.Puts != before.Puts || st.Pins != before.Pins || st.UploadMemory != 0 || residue(t, e.large) != 0 {
				t.Errorf("%s, %d bytes: after the refusal puts +%d, pins +%d, upload memory %d, %d stage files",
					tc.name, size, st.Puts-before.Puts, st.Pins-before.Pins, st.UploadMemory, residue(t, e.large))
			}
		}
	}
}

// A token's pin keeps an entry the namespace dropped alive across sweeps
// for as long as it is renewed; once it lapses, have says false, the next
// sweeps collect the blob, and a re-put restores it.
func TestTokenRenewal(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, size := range []int{2048, 256 << 10} {
		b := randBytes(size, uint64(size))
		d, tok := e.put(t, "builds", b)
		if err := e.svc.Unlink(t.Context(), "builds", d); err != nil {
			t.Fatal(err)
		}
		if got, _ := e.c.Have(t.Context(), "builds", []blob.Digest{d}); got[0] {
			t.Fatal("have without a token answers the namespace, which dropped the entry")
		}
		for i := range 4 {
			e.clock.Advance(40 * time.Second) // under the 60 s TTL each time
			if ok, err := e.c.Renew(t.Context(), "builds", tok, d); !ok || err != nil {
				t.Fatalf("renewal %d: %v, %v", i, ok, err)
			}
			e.srv.ExpireTokens()
			e.sweepAll(t)
			if !e.has(t, d) {
				t.Fatalf("renewal %d: the blob was swept while its token was renewed", i)
			}
		}
		e.clock.Advance(61 * time.Second)
		e.srv.ExpireTokens()
		e.sweepAll(t)
		if e.has(t, d) {
			t.Fatal("the blob outlived its lapsed token")
		}
		if ok, err := e.c.Renew(t.Context(), "builds", tok, d); ok || err != nil {
			t.Fatalf("renewal of a lapsed token = %v, %v; want false and no error", ok, err)
		}
		d2, tok2 := e.put(t, "builds", b)
		if d2 != d || tok2 == tok || !e.has(t, d) {
			t.Fatalf("re-put: %s token %q, present %v", d2, tok2, e.has(t, d))
		}
		if got, _ := e.c.Have(t.Context(), "builds", []blob.Digest{d}); !got[0] {
			t.Fatal("the re-put did not link the entry again")
		}
	}
}

// Without renewals the server itself releases a lapsed token's pin (the
// ticker of Serve), and DELETE releases one at once.
func TestTokenRelease(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := randBytes(4096, 9)
	d, tok := e.put(t, "builds", b)
	if err := e.svc.Unlink(t.Context(), "builds", d); err != nil {
		t.Fatal(err)
	}
	e.sweepAll(t)
	if !e.has(t, d) {
		t.Fatal("swept while its token lives")
	}
	// A direct delete is refused while the token's pin holds the blob.
	url := e.url + "/v1/blobs/" + d.String()
	if status, _, body := request(t, "DELETE", url, nil, nil); status != http.StatusConflict || !bytes.Contains(body, []byte(`"code":"refused"`)) {
		t.Fatalf("DELETE of a pinned blob: %d %s; want 409", status, body)
	}
	if err := e.c.Release(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Release(t.Context(), tok); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("second release: %v; want 404", err)
	}
	e.sweepAll(t)
	if e.has(t, d) {
		t.Fatal("released token still protects its blob")
	}
	if n := e.st.Stats().Pins; n != 0 {
		t.Fatalf("%d pins left after the release", n)
	}
	// Once nothing keeps a blob, a delete removes it at once; then 404.
	d2, tok2 := e.put(t, "builds", []byte("delete me"))
	if status, _, _ := request(t, "DELETE", e.url+"/v1/blobs/"+d2.String(), nil, nil); status != http.StatusConflict {
		t.Fatalf("DELETE of a linked blob: %d; want 409", status)
	}
	e.c.Release(t.Context(), tok2)
	e.svc.Unlink(t.Context(), "builds", d2)
	for _, want := range []int{http.StatusNoContent, http.StatusNotFound} {
		if status, _, _ := request(t, "DELETE", e.url+"/v1/blobs/"+d2.String(), nil, nil); status != want {
			t.Fatalf("DELETE: %d; want %d", status, want)
		}
	}
	if e.has(t, d2) {
		t.Fatal("deleted blob still there")
	}
}

func TestRangedReads(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := randBytes(3<<20+123, 5)
	d, _ := e.put(t, "builds", b)
	size := int64(len(b))
	url := e.url + "/v1/blobs/" + d.String()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 60 {
		var rng string
		var lo, hi int64
		switch i % 3 {
		case 0:
			lo = r.Int64N(size)
			hi = min(lo+r.Int64N(2<<20), size-1)
			rng = fmt.Sprintf("bytes=%d-%d", lo, hi)
		case 1:
			lo, hi = r.Int64N(size), size-1
			rng = fmt.Sprintf("bytes=%d-", lo)
		case 2:
			k := 1 + r.Int64N(1<<20)
			lo, hi = size-k, size-1
			rng = fmt.Sprintf("bytes=-%d", k)
		}
		status, h, body := request(t, "GET", url, nil, map[string]string{"Range": rng})
		if status != http.StatusPartialContent || !bytes.Equal(body, b[lo:hi+1]) {
			t.Fatalf("%s: status %d, %d bytes; want 206 and %d bytes", rng, status, len(body), hi-lo+1)
		}
		if got := h.Get("Repr-Digest"); got != reprDigest(body) {
			t.Fatalf("%s: Repr-Digest %q, the body hashes to %q", rng, got, reprDigest(body))
		}
		if want := fmt.Sprintf("bytes %d-%d/%d", lo, hi, size); h.Get("Content-Range") != want {
			t.Fatalf("%s: Content-Range %q, want %q", rng, h.Get("Content-Range"), want)
		}
	}
	for _, rng := range []string{fmt.Sprintf("bytes=%d-", size), fmt.Sprintf("bytes=%d-%d", size+10, size+20), "bytes=-0", "bytes=5-2", "bytes=x-y"} {
		status, h, body := request(t, "GET", url, nil, map[string]string{"Range": rng})
		if status != http.StatusRequestedRangeNotSatisfiable || h.Get("Content-Range") != fmt.Sprintf("bytes */%d", size) || !bytes.Contains(body, []byte(`"error"`)) {
			t.Fatalf("%s: %d, Content-Range %q, %s; want 416", rng, status, h.Get("Content-Range"), body)
		}
	}
	// Several ranges: the whole blob, with its own digest.
	status, h, body := request(t, "GET", url, nil, map[string]string{"Range": "bytes=0-1,5-9"})
	if status != 200 || !bytes.Equal(body, b) || h.Get("Repr-Digest") != reprDigest(b) {
		t.Fatalf("multi-range: %d, %d bytes", status, len(body))
	}
	// The client checks a slice against the header.
	got, err := e.c.GetRange(t.Context(), d, 1000, 5000)
	if err != nil || !bytes.Equal(got, b[1000:6000]) {
		t.Fatalf("GetRange: %d bytes, %v", len(got), err)
	}
}

// A range longer than store.MaxReadRange is answered with its first
// MaxReadRange bytes, as Content-Range says; the client asks again for the
// rest.
func TestRangeOverReadLimit(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := randBytes(store.MaxReadRange+(1<<20), 6)
	d, _ := e.put(t, "builds", b)
	status, h, body := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, map[string]string{"Range": "bytes=100-"})
	end := 100 + store.MaxReadRange
	if status != http.StatusPartialContent || !bytes.Equal(body, b[100:end]) || h.Get("Repr-Digest") != reprDigest(b[100:end]) ||
		h.Get("Content-Range") != fmt.Sprintf("bytes 100-%d/%d", end-1, len(b)) {
		t.Fatalf("big range: %d, %d bytes, Content-Range %q", status, len(body), h.Get("Content-Range"))
	}
	got, err := e.c.GetRange(t.Context(), d, 100, int64(len(b)))
	if err != nil || !bytes.Equal(got, b[100:]) {
		t.Fatalf("GetRange of the rest: %d bytes, %v", len(got), err)
	}
}

func TestAuth(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "127.0.0.1:0"} {
		if _, err := ops.Listen(addr, ops.ListenConfig{}); !errors.Is(err, ops.ErrNeedsAuth) {
			t.Fatalf("a TCP listen on %s without tokens: %v; want ErrNeedsAuth", addr, err)
		}
	}
	if _, err := ops.Listen("0.0.0.0:0", ops.ListenConfig{InsecureLoopback: true}); !errors.Is(err, ops.ErrNeedsAuth) {
		t.Fatalf("--insecure-loopback on a non-loopback address: %v; want ErrNeedsAuth", err)
	}
	ln, err := ops.Listen("127.0.0.1:0", ops.ListenConfig{InsecureLoopback: true})
	if err != nil {
		t.Fatalf("loopback with InsecureLoopback: %v", err)
	}
	ln.Close()
	ln, err = ops.Listen("0.0.0.0:0", ops.ListenConfig{Tokens: true})
	if err != nil {
		t.Fatalf("non-loopback with tokens: %v", err)
	}
	ln.Close()

	const secret = "tok-7f3a9c1e5b2d"
	e := newEnv(t, envOptions{authToken: secret})
	for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + secret}, {"Authorization": "Bearer " + secret + "x"}} {
		for _, path := range []string{"/metrics", "/v1/blobs/" + blob.Sum(nil).String()} {
			status, h, body := request(t, "GET", e.url+path, nil, hdr)
			if status != http.StatusUnauthorized || h.Get("WWW-Authenticate") == "" || !bytes.Contains(body, []byte("bearer")) {
				t.Fatalf("%s with %v: %d %s; want 401", path, hdr, status, body)
			}
		}
	}
	d, _ := e.put(t, "builds", []byte("authorized")) // the client sends the token
	if status, _, _ := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, map[string]string{"Authorization": "Bearer " + secret}); status != 200 {
		t.Fatalf("with the token: %d", status)
	}
	if strings.Contains(e.log.String(), secret) {
		t.Fatalf("the auth token is in the log:\n%s", e.log.String())
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	os.WriteFile(file, []byte(secret+"\n"), 0o600)
	if got, err := ops.ReadAuthToken(file); got != secret || err != nil {
		t.Fatalf("ReadAuthToken = %q, %v", got, err)
	}
	os.Chmod(file, 0o644)
	if _, err := ops.ReadAuthToken(file); err == nil || !strings.Contains(err.Error(), "other users") {
		t.Fatalf("a world-readable token file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "empty"), []byte("\n"), 0o600)
	if _, err := ops.ReadAuthToken(filepath.Join(dir, "empty")); err == nil {
		t.Fatal("an empty token file was accepted")
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, envOptions{})
	before := e.st.Stats()
	post := func(path, body string) (int, string) {
		status, _, b := request(t, "POST", e.url+path, strings.NewReader(body), nil)
		var er wire.ErrorResponse
		if err := json.Unmarshal(b, &er); status >= 400 && (err != nil || er.Error == "") {
			t.Fatalf("POST %s: %d with body %q; want {\"error\": …}", path, status, b)
		}
		return status, er.Error
	}
	for _, tc := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/v1/blobs/have", `{"namespace": "builds", "digests": [`, 400, "not a have request"},
		{"/v1/blobs/have", `{"namespace": "builds", "digest": []}`, 400, "unknown field"},
		{"/v1/blobs/have", `{"namespace": "nope", "digests": []}`, 404, `namespace "nope" does not exist`},
		{"/v1/blobs/have", `{"namespace": ".bad", "digests": []}`, 400, "namespace"},
		{"/v1/blobs/have", `{"namespace": "builds", "digests": ["xyz"]}`, 400, "digests[0]"},
		{"/v1/blobs/have", `{"namespace": "builds", "digests": [], "token": "t"}`, 400, "exactly one digest"},
		{"/v1/blobs/have", `{"namespace": "builds", "digests": []}{}`, 400, "more than one"},
		{"/v1/blobs?namespace=nope", "content", 404, `namespace "nope" does not exist`},
		{"/v1/blobs", "content", 400, "namespace is required"},
		{"/v1/blobs?namespace=a/b", "content", 400, "namespace"},
	} {
		status, msg := post(tc.path, tc.body)
		if status != tc.status || !strings.Contains(msg, tc.want) {
			t.Errorf("POST %s %.40q: %d %q; want %d mentioning %q", tc.path, tc.body, status, msg, tc.status, tc.want)
		}
	}
	many := wire.HaveRequest{Namespace: "builds", Digests: make([]string, ops.MaxHave+1)}
	for i := range many.Digests {
		many.Digests[i] = blob.Sum(fmt.Append(nil, i)).String()
	}
	body, _ := json.Marshal(many)
	if status, msg := post("/v1/blobs/have", string(body)); status != 400 || !strings.Contains(msg, "10001 digests") || !strings.Contains(msg, "10000") {
		t.Errorf("10001 digests: %d %q", status, msg)
	}
	many.Digests = many.Digests[:ops.MaxHave]
	body, _ = json.Marshal(many)
	if status, _ := post("/v1/blobs/have", string(body)); status != 200 {
		t.Errorf("10000 digests: %d", status)
	}
	if status, _, _ := request(t, "GET", e.url+"/v1/blobs/not-a-digest", nil, nil); status != 400 {
		t.Errorf("GET of a malformed digest: %d", status)
	}

	// A body cut off mid-stream, with and without a length: nothing is
	// published, no stage is left, no pin leaks.
	cuts := 0
	for _, tc := range []struct {
		chunked bool
		size    int
	}{{false, 1 << 20}, {true, 1 << 20}, {false, 100 << 10}, {true, 100 << 10}} {
		chunked := tc.chunked
		content := randBytes(tc.size, 11)
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		hdr := fmt.Sprintf("Content-Length: %d\r\n", len(content))
		part := content[:len(content)/2]
		payload := part
		if chunked {
			hdr = "Transfer-Encoding: chunked\r\n"
			payload = append(fmt.Appendf(nil, "%x\r\n", len(part)), part...)
		}
		fmt.Fprintf(conn, "POST /v1/blobs?namespace=builds HTTP/1.1\r\nHost: x\r\n%s\r\n", hdr)
		conn.Write(payload)
		conn.Close()
		// The server answers the cut (to no one) once its read fails.
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(e.log.String(), "the request body ended early") < cuts+1 {
			if time.Now().After(deadline) {
				t.Fatalf("chunked=%v: the server did not refuse the cut-off put; log:\n%s", chunked, e.log.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		cuts++
		if st := e.st.Stats(); st.Pins != 0 || st.UploadMemory != 0 || residue(t, e.large) != 0 {
			t.Fatalf("chunked=%v: pins %d, upload memory %d, %d stage files left after a cut-off put",
				chunked, st.Pins, st.UploadMemory, residue(t, e.large))
		}
		if e.has(t, blob.Sum(content)) || e.has(t, blob.Sum(part)) {
			t.Fatalf("chunked=%v: a cut-off body was published", chunked)
		}
	}
	after := e.st.Stats()
	if after.Puts != before.Puts {
		t.Errorf("bad input stored %d blobs", after.Puts-before.Puts)
	}
	if n, err := e.svc.Count(t.Context(), "builds"); n != 0 || err != nil {
		t.Errorf("the namespace holds %d entries after bad input (%v)", n, err)
	}

	// Over a kv-only store's threshold: 413 before the body is stored.
	kvOnly := newEnv(t, envOptions{kvOnly: true})
	big := randBytes(int(kvOnly.st.Threshold())+1, 12)
	if _, _, err := kvOnly.c.Put(t.Context(), "builds", bytes.NewReader(big), int64(len(big)), nil); !errors.Is(err, blob.ErrTooLarge) {
		t.Fatalf("over the threshold: %v; want 413", err)
	}
	if _, _, err := kvOnly.c.Put(t.Context(), "builds", bytes.NewReader(big), -1, nil); !errors.Is(err, blob.ErrTooLarge) {
		t.Fatalf("over the threshold, chunked: %v; want 413", err)
	}
}

// A backend that is gone answers 503 with Retry-After.
func TestBackendDown(t *testing.T) {
	e := newEnv(t, envOptions{})
	d, _ := e.put(t, "builds", []byte("before"))
	e.st.Close()
	status, h, body := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, nil)
	if status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !bytes.Contains(body, []byte(`"code":"unavailable"`)) {
		t.Fatalf("GET on a closed store: %d %s", status, body)
	}
	// The store's own error names its engine and files: the body names
	// neither, only the request's digest and the code.
	_, _, put := request(t, "POST", e.url+"/v1/blobs?namespace=builds", strings.NewReader("after"), nil)
	_, _, del := request(t, "DELETE", e.url+"/v1/blobs/"+d.String(), nil, nil)
	for _, b := range [][]byte{body, put, del} {
		for _, leak := range []string{"sqlite", "kv.db", "large", "/tmp", os.TempDir(), "closed"} {
			if bytes.Contains(b, []byte(leak)) {
				t.Errorf("an error body names %q: %s", leak, b)
			}
		}
	}
	if !strings.Contains(e.log.String(), "closed") {
		t.Errorf("the log lacks the store's error:\n%s", e.log.String())
	}
}

func residue(t *testing.T, large engines.Large) int {
	t.Helper()
	rc, ok := large.(engines.ResidueCounter)
	if !ok {
		return 0
	}
	n, err := rc.StageResidue(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A large blob whose bytes rotted on disk: a whole GET is cut off before
// the bad chunk, never a complete-looking 200; a range over it fails with
// 422; a range elsewhere reads until a read has found the rot, and from
// then on every request is refused up front as corrupt (the store's
// ledger, as after a scrub), until the content is put again.
func TestCorruptBlobCutOff(t *testing.T) {
	e := newEnv(t, envOptions{})
	// rotted puts 3 MiB and flips a byte 2 MiB into its file.
	rotted := func(seed uint64) ([]byte, blob.Digest) {
		b := randBytes(3<<20, seed)
		d, _ := e.put(t, "builds", b)
		cur, err := e.large.Open(t.Context(), d)
		if err != nil {
			t.Fatal(err)
		}
		path := cur.(engines.FileCursor).File().Name()
		cur.Close()
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte{b[2<<20] ^ 0xff}, 2<<20)
		f.Close()
		return b, d
	}

	b, d := rotted(31)
	resp, err := http.Get(e.url + "/v1/blobs/" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || len(got) >= len(b) {
		t.Fatalf("whole GET of a corrupt blob: %d, %d bytes, read error %v; want a cut-off body", resp.StatusCode, len(got), err)
	}
	if !bytes.Equal(got, b[:len(got)]) || len(got) > 2<<20 {
		t.Fatalf("the cut-off body holds %d bytes, some past the bad chunk or wrong", len(got))
	}
	if !strings.Contains(e.log.String(), d.String()) {
		t.Fatal("no log line names the corrupt blob")
	}
	if status, _, _ := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, map[string]string{"Range": "bytes=0-999"}); status != http.StatusInternalServerError {
		t.Fatalf("range over good bytes of a blob a read found corrupt: %d; want 500 (corrupt)", status)
	}

	b, d = rotted(32)
	if status, _, body := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, map[string]string{"Range": "bytes=0-999"}); status != 206 || !bytes.Equal(body, b[:1000]) {
		t.Fatalf("range over good bytes: %d", status)
	}
	if status, _, _ := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, map[string]string{"Range": fmt.Sprintf("bytes=%d-%d", 2<<20, 2<<20+9)}); status != http.StatusUnprocessableEntity {
		t.Fatalf("range over the bad byte: %d; want 422", status)
	}
	if status, _, _ := request(t, "GET", e.url+"/v1/blobs/"+d.String(), nil, nil); status != http.StatusInternalServerError {
		t.Fatalf("whole GET of a blob a read found corrupt: %d; want 500 (corrupt), before any byte", status)
	}
}

// Serve: lapsed tokens are released by its ticker; a shutdown lets a put
// in flight finish; a read-only server refuses puts and deletes.
func TestServeLifecycle(t *testing.T) {
	e := newEnv(t, envOptions{})
	st, svc := e.st, e.svc
	logs := &syncBuffer{}
	srv := ops.New(ops.Config{Store: st, Namespaces: svc, TokenTTL: 300 * time.Millisecond, InsecureLoopback: true,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ln, err := ops.Listen("127.0.0.1:0", ops.ListenConfig{InsecureLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	c, _ := client.New("http://"+ln.Addr().String(), "")
	if _, _, err := c.Put(t.Context(), "builds", strings.NewReader("lapses"), 6, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for st.Stats().Pins != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a lapsed token's pin was not released by Serve's ticker")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A put streaming while the server is told to stop still completes.
	// It has a client of its own: a shutdown closes idle connections, and
	// a request that picked the first put's kept-alive one as the server
	// closed it would fail (no server can tell it was coming).
	pr, pw := io.Pipe()
	content := randBytes(400<<10, 41)
	put := make(chan error, 1)
	fresh, _ := client.New("http://"+ln.Addr().String(), "")
	go func() {
		_, _, err := fresh.Put(t.Context(), "builds", pr, int64(len(content)), nil)
		put <- err
	}()
	pw.Write(content[:100<<10])
	// Stop once the server is handling the put (before, its connection
	// may not even be accepted yet, and a shutdown rightly drops it).
	deadline = time.Now().Add(5 * time.Second)
	for strings.Count(logs.String(), `msg="http request" route=put`) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the second put never reached the server:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	time.Sleep(100 * time.Millisecond)
	pw.Write(content[100<<10:])
	pw.Close()
	if err := <-put; err != nil {
		t.Fatalf("a put in flight at shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if n := st.Stats().Pins; n != 0 {
		t.Fatalf("%d pins held after Serve returned", n)
	}
	if ok, _ := st.Has(t.Context(), blob.Sum(content)); !ok {
		t.Fatal("the put in flight at shutdown was lost")
	}

	ro := ops.New(ops.Config{Store: st, Namespaces: svc, ReadOnly: true, InsecureLoopback: true})
	hs := httptest.NewServer(ro.Handler())
	defer hs.Close()
	defer ro.Close()
	rc, _ := client.New(hs.URL, "")
	if _, _, err := rc.Put(t.Context(), "builds", strings.NewReader("x"), 1, nil); err == nil || !strings.Contains(err.Error(), "(403)") {
		t.Fatalf("put on a read-only server: %v; want 403", err)
	}
	if status, _, _ := request(t, "DELETE", hs.URL+"/v1/blobs/"+blob.Sum(content).String(), nil, nil); status != http.StatusForbidden {
		t.Fatalf("delete on a read-only server: %d; want 403", status)
	}
	if _, _, err := rc.Get(t.Context(), blob.Sum(content), "builds"); err != nil {
		t.Fatalf("get on a read-only server: %v", err)
	}
}
