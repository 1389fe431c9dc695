package namespaces_test

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestPutQuota: puts into a namespace through the namespace parts the
// surfaces use — store.WithLink with the Service's LinkRows (the CLI's
// put --ns, HTTP) and PendRows (the mount's close) — are charged the
// content's size, and a put over the quota fails with blob.ErrQuota and
// links nothing; where the kv engine joins the link to the put's
// transaction (SQLite, PostgreSQL) it publishes nothing either. On
// PostgreSQL, concurrent puts go in batches (one statement, or one
// transaction): exactly the ones that fit succeed, and the others' failure
// fails none of their neighbours.
func TestPutQuota(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kv    func(t *testing.T) engines.KV
		joint bool
	}{
		{"sqlite", func(t *testing.T) engines.KV {
			e, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "kv.db"))
			if err != nil {
				t.Fatal(err)
			}
			return e
		}, true},
		{"mem", func(t *testing.T) engines.KV { return mem.New() }, false},
		{"postgres", func(t *testing.T) engines.KV {
			e, err := postgres.Open(t.Context(), pgtest.DSN(t))
			if err != nil {
				t.Fatal(err)
			}
			return e
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testPutQuota(t, tc.kv(t), tc.joint) })
	}
}

func testPutQuota(t *testing.T, kv engines.KV, joint bool) {
	ctx := t.Context()
	st, err := store.Open(ctx, store.Config{KV: kv, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r, err := namespaces.Open(ctx, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Register(r)
	svc := namespaces.NewService(r, st)
	ns := fmt.Sprint("q", time.Now().UnixNano())
	mustDo(t, svc.Create(ctx, ns))
	mustDo(t, svc.SetQuota(ctx, ns, namespaces.Quota{Bytes: 100}))
	usage := func(blobs, bytes int64, what string) {
		t.Helper()
		u, err := svc.Usage(ctx, ns)
		if err != nil || u.Blobs != blobs || u.Bytes != bytes {
			t.Fatalf("%s: usage = %+v, %v; want %d blobs, %d bytes", what, u, err, blobs, bytes)
		}
	}
	content := func(n int, tag string) []byte {
		b := []byte(fmt.Sprintf("%s %s %0*d", tag, ns, n, 0))
		return b[:n]
	}
	refused := func(d blob.Digest, what string) {
		t.Helper()
		if _, ok, err := svc.Has(ctx, ns, d); err != nil || ok {
			t.Fatalf("%s: the namespace links the refused blob (%v, %v)", what, ok, err)
		}
		if ok, err := st.Has(ctx, d); err != nil || (joint && ok) {
			t.Fatalf("%s: the refused put published its blob (%v, %v) in the put's transaction", what, ok, err)
		}
	}
	put := func(b []byte, part meta.NSRows) (blob.Digest, error) {
		d, pin, err := st.PutBytes(ctx, b, store.WithLink(svc, part), store.ReleasesPinAtOnce())
		if err == nil {
			pin.Release()
		}
		return d, err
	}
	holder := namespaces.Pending{Holder: "quota-test", TTL: time.Minute}
	link := func() meta.NSRows {
		part, err := svc.LinkRows(ns)
		mustDo(t, err)
		return part
	}
	pend := func(i *namespaces.Intent) meta.NSRows {
		part, id, err := svc.PendRows(ns, holder)
		mustDo(t, err)
		*i = id
		return part
	}

	// LinkRows: under, then over.
	first := content(60, "first")
	if _, err := put(first, link()); err != nil {
		t.Fatal(err)
	}
	usage(1, 60, "after a 60-byte put")
	over := content(41, "over")
	_, err = put(over, link())
	if !errors.Is(err, blob.ErrQuota) {
		t.Fatalf("a put 1 byte over the quota = %v; want ErrQuota", err)
	}
	refused(blob.Sum(over), "LinkRows over the quota")
	usage(1, 60, "after a refused put")

	// PendRows (the mount's close): over, then at.
	var i namespaces.Intent
	_, err = put(over, pend(&i))
	if !errors.Is(err, blob.ErrQuota) {
		t.Fatalf("a close 1 byte over the quota = %v; want ErrQuota", err)
	}
	refused(blob.Sum(over), "PendRows over the quota")
	if live, err := r.IsLive(ctx, blob.Sum(over)); err != nil || live {
		t.Fatalf("a refused intent keeps its blob live (%v, %v)", live, err)
	}
	at := content(40, "at")
	if _, err := put(at, pend(&i)); err != nil || i == 0 {
		t.Fatalf("a close at the quota = intent %d, %v", i, err)
	}
	usage(2, 100, "at the quota, by an intent")
	if _, err := svc.Settle(ctx, i); err != nil {
		t.Fatal(err)
	}
	usage(2, 100, "after settling it")

	// A close refused over the quota after its transaction dropped the
	// writer's earlier intent, freeing its charge (a kill -9 before
	// COMMIT is the same rollback), leaves the counters as they were:
	// they are rows of the same transaction.
	if joint {
		mustDo(t, svc.SetQuota(ctx, ns, namespaces.Quota{}))
		var earlier namespaces.Intent
		if _, err := put(content(30, "earlier"), pend(&earlier)); err != nil {
			t.Fatal(err)
		}
		usage(3, 130, "after an intent without a limit")
		mustDo(t, svc.SetQuota(ctx, ns, namespaces.Quota{Bytes: 130}))
		rolled := content(31, "rolled back")
		part, _, err := svc.PendRows(ns, namespaces.Pending{Holder: holder.Holder, TTL: holder.TTL, Replaces: earlier})
		mustDo(t, err)
		if _, err := put(rolled, part); !errors.Is(err, blob.ErrQuota) {
			t.Fatalf("a close 1 byte over the quota once its earlier intent is dropped = %v; want ErrQuota", err)
		}
		refused(blob.Sum(rolled), "a close rolled back after dropping its earlier intent")
		usage(3, 130, "after a close rolled back after dropping its earlier intent")
		mustDo(t, svc.Cancel(ctx, earlier))
		usage(2, 100, "after the earlier intent is cancelled")
		mustDo(t, svc.SetQuota(ctx, ns, namespaces.Quota{Bytes: 100}))
	}

	// A dedup at the limit costs nothing and is not refused.
	if _, err := put(first, link()); err != nil {
		t.Fatalf("a dedup put at the quota: %v", err)
	}
	usage(2, 100, "after a dedup")

	// Concurrent closes racing for the last bytes: on PostgreSQL they
	// batch, and the refused ones must not take their neighbours down.
	const room, writers, size = 5, 16, 10
	mustDo(t, svc.SetQuota(ctx, ns, namespaces.Quota{Bytes: 100 + room*size}))
	var ok, quota atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			var i namespaces.Intent
			_, err := put(content(size, fmt.Sprint("w", w)), pend(&i))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, blob.ErrQuota):
				quota.Add(1)
			default:
				errs <- fmt.Errorf("writer %d: %w", w, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ok.Load() != room || quota.Load() != writers-room {
		t.Fatalf("%d racing closes succeeded, %d were refused; want %d and %d", ok.Load(), quota.Load(), room, writers-room)
	}
	usage(2+room, 100+room*size, "after the race")
	if n, err := svc.Recount(ctx); err != nil || n != 0 {
		t.Fatalf("Recount after the puts = %d, %v; want 0 fixed", n, err)
	}
}

// TestServiceChargesPoolSize: a Service's Link, LinkMany and Pend charge
// the size the pool holds, whatever size the caller names.
func TestServiceChargesPoolSize(t *testing.T) {
	ctx := t.Context()
	kv := mem.New()
	st, err := store.Open(ctx, store.Config{KV: kv, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := namespaces.NewMem(nil)
	st.Register(r)
	svc := namespaces.NewService(r, st)
	mustDo(t, svc.Create(ctx, "a"))
	var ds []blob.Digest
	for _, n := range []int{3, 5, 7} {
		d, pin, err := st.PutBytes(ctx, []byte(fmt.Sprintf("%0*d", n, 0)))
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
		ds = append(ds, d)
	}
	if _, err := svc.LinkSized(ctx, "a", ds[0], 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.LinkMany(ctx, "a", ds[1:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Pend(ctx, "a", ds[2], namespaces.Pending{Holder: "h", TTL: time.Minute, Size: 1000}); err != nil {
		t.Fatal(err)
	}
	u, err := svc.Usage(ctx, "a")
	if err != nil || u.Blobs != 3 || u.Bytes != 15 {
		t.Fatalf("usage = %+v, %v; want 3 blobs, 15 bytes (the pool's sizes)", u, err)
	}
}
