package ops_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/client"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/wire"
)

// TestQuotaHTTP: under and at the limit a put links; over it the answer
// is 507 with code quota, naming the namespace, its limit and usage, and
// nothing is linked; an unlink frees at once; usage reads back what the
// registry keeps; DELETE clears the quota; bad quotas are 400.
func TestQuotaHTTP(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	if _, err := e.c.SetQuota(ctx, "builds", 100, 0); err != nil {
		t.Fatal(err)
	}
	a, _ := e.put(t, "builds", bytes.Repeat([]byte("a"), 60))
	e.put(t, "builds", bytes.Repeat([]byte("b"), 40)) // at the limit
	over := bytes.Repeat([]byte("c"), 1)
	_, _, err := e.c.Put(ctx, "builds", bytes.NewReader(over), int64(len(over)), nil)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusInsufficientStorage || ce.Code != wire.CodeQuota || !errors.Is(err, blob.ErrQuota) {
		t.Fatalf("put over the quota: %v; want 507 with code quota", err)
	}
	for _, w := range []string{`"builds"`, "100 of 100 bytes", "2 blobs", "nothing was linked"} {
		if !strings.Contains(ce.Msg, w) {
			t.Errorf("the 507's message %q does not say %q", ce.Msg, w)
		}
	}
	if _, ok, err := e.svc.Has(ctx, "builds", blob.Sum(over)); err != nil || ok {
		t.Errorf("the refused put is linked: %v, %v", ok, err)
	}
	// Over the kv threshold the content is stored before its link is
	// refused: unreferenced, it goes at the next sweeps.
	big := randBytes(256<<10, 38)
	if _, _, err := e.c.Put(ctx, "builds", bytes.NewReader(big), int64(len(big)), nil); !errors.Is(err, blob.ErrQuota) {
		t.Fatalf("a large put over the quota: %v", err)
	}
	e.sweepAll(t)
	if e.has(t, blob.Sum(big)) {
		t.Error("the content of a refused put outlived two sweeps")
	}
	u, err := e.c.Usage(ctx, "builds")
	if err != nil {
		t.Fatal(err)
	}
	if u.Unique == nil || *u.Unique != (wire.Unique{Blobs: 2, Bytes: 100}) {
		t.Errorf("usage's unique figures = %+v, want 2 blobs, 100 bytes", u.Unique)
	}
	u.Unique = nil
	if want := (wire.Usage{Namespace: "builds", Blobs: 2, Bytes: 100, Quota: wire.Quota{Bytes: 100}}); u != want {
		t.Errorf("usage = %+v, want %+v", u, want)
	}

	// Unlinking frees at once: the refused put fits now.
	if status, _, body := request(t, http.MethodDelete, e.url+"/v1/blobs/"+a.String()+"?namespace=builds", nil, nil); status != http.StatusNoContent {
		t.Fatalf("unlink: %d %s", status, body)
	}
	e.put(t, "builds", over)

	// Clearing: DELETE answers the usage without a quota.
	status, _, body := request(t, http.MethodDelete, e.url+"/v1/namespaces/builds/quota", nil, nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"quota":{"bytes":0,"blobs":0}`) || strings.Contains(string(body), `"unique"`) {
		t.Errorf("DELETE quota: %d %s; want the counters and no unique figures", status, body)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodPut, "/v1/namespaces/builds/quota", `{"bytes":-1}`, http.StatusBadRequest},
		{http.MethodPut, "/v1/namespaces/builds/quota", `{"bytes":1,"inodes":2}`, http.StatusBadRequest},
		{http.MethodPut, "/v1/namespaces/builds/quota", `{"bytes":1}{}`, http.StatusBadRequest},
		{http.MethodPut, "/v1/namespaces/builds/quota", strings.Repeat(" ", 300) + `{"bytes":1}`, http.StatusBadRequest},
		{http.MethodPut, "/v1/namespaces/absent/quota", `{"bytes":1}`, http.StatusNotFound},
		{http.MethodPut, "/v1/namespaces/.bad/quota", `{"bytes":1}`, http.StatusBadRequest},
		{http.MethodGet, "/v1/namespaces/absent/usage", "", http.StatusNotFound},
	} {
		status, _, body := request(t, tc.method, e.url+tc.path, strings.NewReader(tc.body), nil)
		if status != tc.status || !bytes.Contains(body, []byte(`"code":"`)) {
			t.Errorf("%s %s %q: %d %s, want %d with a code", tc.method, tc.path, tc.body, status, body, tc.status)
		}
	}
}

// TestQuotaHTTPAccess: usage is for those who may search the namespace,
// setting a quota for root and the server's own user (namespaces.
// AllowedQuota), and /metrics shows each caller the usage of the
// namespaces it may search, and only those.
func TestQuotaHTTPAccess(t *testing.T) {
	ops.SetNamespaceInterval(t, 0) // every scrape starts a count: the next one sees it
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	// alice (1001) owns "private", mode 0700; "builds" is everyone's.
	if err := e.svc.CreatePerm(ctx, "private", namespaces.Perm{Uid: 1001, Gid: 1001, Mode: 0o700}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Link(ctx, "builds", e.putStore(t, "in builds")); err != nil {
		t.Fatal(err)
	}
	_, url := serveBounded(t, e, ops.Config{Owner: &namespaces.Principal{UID: 1002, GIDs: []uint32{1002}}, PermTTL: -1})
	alice, _ := client.New(url, aliceTok)
	bob, _ := client.New(url, bobTok) // the server's own user

	if _, err := alice.Usage(ctx, "private"); err != nil {
		t.Errorf("the owner's usage of her namespace: %v", err)
	}
	if _, err := bob.Usage(ctx, "private"); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("usage of a namespace bob may not search: %v, want 403", err)
	}
	// A namespace's owner may not raise her own limit; the server's own
	// user may.
	if _, err := alice.SetQuota(ctx, "private", 1<<30, 0); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("the namespace's owner set its quota: %v, want 403", err)
	}
	if _, err := bob.SetQuota(ctx, "private", 1000, 3); err != nil {
		t.Errorf("the server's own user setting a quota: %v", err)
	}

	seen := func(tok string) map[string]bool {
		t.Helper()
		_, _, body := request(t, http.MethodGet, url+"/metrics", nil, map[string]string{"Authorization": "Bearer " + tok})
		got := map[string]bool{}
		for l := range strings.SplitSeq(string(body), "\n") {
			if name, rest, ok := strings.Cut(l, `{namespace="`); ok && strings.HasPrefix(name, "alkblobfs_namespace_") {
				ns, _, _ := strings.Cut(rest, `"`)
				got[name+" "+ns] = true
			}
		}
		return got
	}
	// The first scrape starts the count in the background.
	var a, b map[string]bool
	waitFor(t, "the namespaces' usage in /metrics", 10*time.Second, func() bool {
		a, b = seen(aliceTok), seen(bobTok)
		return a["alkblobfs_namespace_quota_blobs private"] && b["alkblobfs_namespace_bytes builds"]
	})
	for _, m := range []string{"alkblobfs_namespace_bytes private", "alkblobfs_namespace_blobs private", "alkblobfs_namespace_quota_bytes private", "alkblobfs_namespace_quota_blobs private", "alkblobfs_namespace_bytes builds"} {
		if !a[m] {
			t.Errorf("alice's /metrics lacks %s: %v", m, a)
		}
	}
	if b["alkblobfs_namespace_bytes private"] || !b["alkblobfs_namespace_bytes builds"] {
		t.Errorf("bob's /metrics: %v; want builds and not private", b)
	}
	if a["alkblobfs_namespace_quota_bytes builds"] {
		t.Error("/metrics has a quota series for a namespace without a quota")
	}
}

// TestNamespaceSeriesBound: a scrape reports the usage of at most the
// first namespaces in name order that the caller may see.
func TestNamespaceSeriesBound(t *testing.T) {
	ops.SetMaxNamespaceSeries(t, 2)
	ops.SetNamespaceInterval(t, 0)
	e := newEnv(t, envOptions{})
	for _, ns := range []string{"c", "a"} {
		if err := e.svc.Create(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	waitFor(t, "the namespaces' usage in /metrics", 10*time.Second, func() bool {
		_, _, body := request(t, http.MethodGet, e.url+"/metrics", nil, nil)
		got = got[:0]
		for l := range strings.SplitSeq(string(body), "\n") {
			if ns, ok := strings.CutPrefix(l, `alkblobfs_namespace_blobs{namespace="`); ok {
				ns, _, _ = strings.Cut(ns, `"`)
				got = append(got, ns)
			}
		}
		return len(got) > 0
	})
	if strings.Join(got, " ") != "a builds" {
		t.Errorf("a scrape bounded to 2 namespaces reports %q, want a and builds", got)
	}
}

// putStore puts s into the store, linked nowhere, and returns its digest.
func (e *env) putStore(t *testing.T, s string) blob.Digest {
	t.Helper()
	d, pin, err := e.st.Put(t.Context(), strings.NewReader(s), int64(len(s)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pin.Release)
	return d
}

// uniqueCounter counts the calls of Registry.Unique, the query over all of
// a namespace's references, which only GET .../usage may run. It passes
// Joinable on, which a put's publication needs.
type uniqueCounter struct {
	namespaces.Registry
	namespaces.Joinable
	calls atomic.Int64
}

func (u *uniqueCounter) Unique(ctx context.Context, name string) (namespaces.UniqueUsage, error) {
	u.calls.Add(1)
	return u.Registry.Unique(ctx, name)
}

// TestUniqueOnlyWhenAsked: /metrics counts, a refused put's 507 and a
// quota change read the namespace's kept counters, never the unique
// figures (O(the namespace's references) each: on a large store a scan
// per namespace every count); GET .../usage does compute them.
func TestUniqueOnlyWhenAsked(t *testing.T) {
	ops.SetNamespaceInterval(t, 0)
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	reg := &uniqueCounter{Registry: e.svc.Registry, Joinable: e.svc.Registry.(namespaces.Joinable)}
	srv := ops.New(ops.Config{Store: e.st, Namespaces: namespaces.NewService(reg, e.st), InsecureLoopback: true, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); srv.Close() })
	url := hs.URL
	c, err := client.New(url, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"a", "b"} {
		if err := e.svc.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	u, err := c.SetQuota(ctx, "builds", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if u.Unique != nil {
		t.Errorf("the quota change's answer has unique figures %+v", *u.Unique)
	}
	if _, _, err := c.Put(ctx, "builds", bytes.NewReader(make([]byte, 11)), 11, nil); !errors.Is(err, blob.ErrQuota) {
		t.Fatalf("a put over the quota: %v, want a 507", err)
	}
	// Several whole counts: each scrape after the first count ends starts
	// another, since the interval is 0.
	scrapes := 0
	waitFor(t, "three scrapes with the namespaces' usage", 10*time.Second, func() bool {
		_, _, body := request(t, http.MethodGet, url+"/metrics", nil, nil)
		if bytes.Contains(body, []byte(`alkblobfs_namespace_blobs{namespace="b"}`)) {
			scrapes++
		}
		return scrapes >= 3
	})
	if n := reg.calls.Load(); n != 0 {
		t.Fatalf("/metrics, a 507 and a quota change ran the unique query %d times, want 0", n)
	}
	if _, err := c.Usage(ctx, "builds"); err != nil {
		t.Fatal(err)
	}
	if n := reg.calls.Load(); n != 1 {
		t.Errorf("GET usage ran the unique query %d times, want 1", n)
	}
}

// TestQuotaStateWords: what a namespace holds, in words with the right
// number: one blob is "1 blob", a limit of one "of 1 blob".
func TestQuotaStateWords(t *testing.T) {
	for _, tc := range []struct {
		u    namespaces.Usage
		want string
	}{
		{namespaces.Usage{Blobs: 1, Bytes: 1}, "holds 1 byte and 1 blob"},
		{namespaces.Usage{Blobs: 0, Bytes: 0}, "holds 0 bytes and 0 blobs"},
		{namespaces.Usage{Blobs: 2, Bytes: 90, Quota: namespaces.Quota{Bytes: 100}}, "holds 90 of 100 bytes and 2 blobs"},
		{namespaces.Usage{Blobs: 1, Bytes: 5, Quota: namespaces.Quota{Blobs: 1}}, "holds 5 bytes and 1 of 1 blob"},
	} {
		if got := ops.QuotaState(tc.u); got != tc.want {
			t.Errorf("QuotaState(%+v) = %q, want %q", tc.u, got, tc.want)
		}
	}
}
