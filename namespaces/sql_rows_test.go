package namespaces_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestSQLiteLinkedPutNeedsNoPinRow: on SQLite a small put that links or
// records an intent in its own transaction, and whose caller drops its pin
// at once (store.ReleasesPinAtOnce), writes no gc_pins row, and the
// reference or intent alone keeps the blob from another process's sweep —
// here a second store on the same database (its own engine, collector and
// owner), whose window already holds the digest when the put commits, so
// the sweep's arbitration, not its mark, must find what protects it
// (docs/gc.md, "What a small close writes").
func TestSQLiteLinkedPutNeedsNoPinRow(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "kv.db")
	open := func() (*store.Store, *namespaces.Service, *sqlite.Engine) {
		kv, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
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
		return st, namespaces.NewService(r, st), kv
	}
	a, svcA, kv := open()
	b, _, _ := open()
	mustDo(t, svcA.Create(ctx, "builds"))

	rows := func() int {
		// A put the close journal took commits after it returned: count
		// once it has.
		if err := kv.Batcher().Visible(ctx); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := kv.DB().QueryRowContext(ctx, `SELECT count(*) FROM gc_pins`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	has := func(st *store.Store, d blob.Digest) bool {
		ok, err := st.Has(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	sweepB := func(when string) store.Report {
		rep, err := b.Sweep(ctx)
		if err != nil || rep.Aborted != "" {
			t.Fatalf("%s: sweep: %+v, %v", when, rep, err)
		}
		return rep
	}

	// Both contents are in the pool, unprotected, when b's first sweep
	// queues them.
	intent, ref := []byte("closed, last descriptor still open"), []byte("put --ns")
	for _, c := range [][]byte{intent, ref} {
		_, pin, err := b.PutBytes(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
	}
	if rep := sweepB("first sweep"); rep.Queued != 2 {
		t.Fatalf("first sweep: %+v; want both contents queued", rep)
	}

	// a puts them again, one with an intent (a close in incoming/), one
	// with a reference (put --ns), and lets go of its pins.
	before := rows()
	part, i, err := svcA.PendRows("builds", namespaces.Pending{Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	di, pin, err := a.PutBytes(ctx, intent, store.WithLink(svcA, part), store.ReleasesPinAtOnce())
	if err != nil || i == 0 {
		t.Fatalf("put with an intent: %v (intent %d)", err, i)
	}
	pin.Release()
	dr, pin, err := a.PutBytes(ctx, ref, linkTo(t, svcA, "builds"), store.ReleasesPinAtOnce())
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	if n := rows(); n != before {
		t.Fatalf("the linked puts wrote %d gc_pins rows; want none: their intent and reference protect them", n-before)
	}
	// Without that promise a linked put writes its row: its pin may be
	// kept or handed on (an HTTP pin token), and must protect the blob in
	// every process once no namespace links it.
	_, pin, err = a.PutBytes(ctx, []byte("a pin kept"), linkTo(t, svcA, "builds"))
	if err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != before+1 {
		t.Fatalf("a linked put whose pin is kept wrote %d gc_pins rows; want 1", n-before)
	}
	pin.Release()

	// b's next sweep executes its window: the intent and the reference,
	// read in its arbitration, keep both.
	if rep := sweepB("second sweep"); rep.Cancelled != 2 || rep.Deleted != 0 {
		t.Fatalf("second sweep: %+v; want both cancelled by arbitration", rep)
	}
	if !has(b, di) || !has(b, dr) {
		t.Fatalf("a blob an intent (%v) or a reference (%v) protects was swept", has(b, di), has(b, dr))
	}

	// Without them, b deletes both: nothing else was keeping them.
	mustDo(t, svcA.Cancel(ctx, i))
	mustDo(t, svcA.Unlink(ctx, "builds", dr))
	sweepB("third sweep")
	if rep := sweepB("fourth sweep"); rep.Deleted != 2 {
		t.Fatalf("fourth sweep: %+v; want both deleted once unprotected", rep)
	}
}

// TestSQLitePendingIndexes: a SQLite registry keeps ns_pending(digest),
// which liveness probes (IsLive on every store miss, an arbitration
// batch, each page of a sweep's mark) where the intents of a dead mount's
// backlog or of a big cp -r may be many, and no index on
// ns_pending(holder), which cost every intent a b-tree write and served
// only Renew and Recover. An older database with the holder index loses it
// at the next open; one a build of this week opened, which dropped the
// digest index, gets it back; on read-only media such a database opens
// without it. Its intents still protect their blobs, renew and recover.
func TestSQLitePendingIndexes(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	path := filepath.Join(dir, "kv.db")
	kv, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	indexes := func(kv *sqlite.Engine) (digest, holder bool) {
		rows, err := kv.DB().QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ns_pending'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			digest = digest || name == "ns_pending_digest"
			holder = holder || name == "ns_pending_holder"
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return digest, holder
	}
	want := func(when string, kv *sqlite.Engine, wantDigest bool) {
		t.Helper()
		digest, holder := indexes(kv)
		if digest != wantDigest || holder {
			t.Fatalf("%s: ns_pending_digest %v (want %v), ns_pending_holder %v (want none)", when, digest, wantDigest, holder)
		}
	}
	r, err := namespaces.Open(ctx, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	want("a new database", kv, true)
	mustDo(t, r.Create(ctx, "a"))
	d := blob.Sum([]byte("pending"))
	if _, err := r.Pend(ctx, "a", d, namespaces.Pending{Holder: "old", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	live := func(r namespaces.Registry) {
		t.Helper()
		if ok, err := r.IsLive(ctx, d); !ok || err != nil {
			t.Fatalf("IsLive of a pending digest = %v, %v; want live", ok, err)
		}
		if live, err := r.(*namespaces.SQL).LiveAmong(ctx, []blob.Digest{d, blob.Sum([]byte("other"))}); len(live) != 1 || !live[d] || err != nil {
			t.Fatalf("LiveAmong = %v, %v; want the pending digest alone", live, err)
		}
	}
	// As an older build left it (the holder index), then one of this week
	// (no digest index).
	for _, q := range []string{`CREATE INDEX ns_pending_holder ON ns_pending (holder)`, `DROP INDEX ns_pending_digest`} {
		if _, err := kv.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("read-only media", func(t *testing.T) {
		ro := openReadOnly(t, dir)
		defer ro.Close()
		r, err := namespaces.Open(ctx, ro, nil)
		if err != nil {
			t.Fatalf("a database without ns_pending_digest on read-only media: %v", err)
		}
		live(r)
	})
	r, err = namespaces.Open(ctx, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	want("reopened", kv, true)
	live(r)
	mustDo(t, r.Renew(ctx, "old", time.Minute))
	if n, err := r.Recover(ctx, "old"); n != 1 || err != nil {
		t.Fatalf("Recover of the holder = %d, %v; want its intent", n, err)
	}
	if _, ok, err := r.Has(ctx, "a", d); !ok || err != nil {
		t.Fatalf("recovered intent not linked: %v, %v", ok, err)
	}
}

// openReadOnly opens dir/kv.db through a read-only bind mount of dir.
func openReadOnly(t *testing.T, dir string) *sqlite.Engine {
	t.Helper()
	ro := t.TempDir()
	if err := syscall.Mount(dir, ro, "", syscall.MS_BIND, ""); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skip("a read-only bind mount needs root:", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(ro, syscall.MNT_DETACH) })
	if err := syscall.Mount("", ro, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	e, err := sqlite.Open(context.Background(), filepath.Join(ro, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	if !e.ReadOnly() {
		e.Close()
		t.Fatal("opened read-write on a read-only mount")
	}
	return e
}
