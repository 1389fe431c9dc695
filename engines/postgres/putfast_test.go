package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestPutBatchOneStatement: a put whose rows are a pin row and a
// namespace intent commits as one statement (no transaction of its own),
// with its blob, pin row and intent; one with a link commits in a
// transaction. An intent for an absent namespace fails its put with the
// registry's ErrNotFound and commits nothing: the one-statement batch,
// refused by the server (the foreign key), runs again in a transaction,
// where meta's own statement tells.
func TestPutBatchOneStatement(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	reg, ns := namespaceIn(t, e, "fast")
	owner := t.Name()
	defer e.Meta().Host.DropOwner(context.Background(), owner)
	pend := func(name string, d blob.Digest, size int, out *namespaces.Intent) meta.Rows {
		*out = namespaces.Intent(meta.NewIntentID())
		ns := meta.NSRows{Intent: &meta.IntentRow{ID: int64(*out), NS: name, Holder: owner, TTL: time.Minute}}
		return meta.Rows{Pin: &meta.PinRow{D: d, Owner: owner, TTL: time.Minute}, NS: reg.Join(ns).For(d, int64(size))}
	}
	counts := func(d blob.Digest, i namespaces.Intent) (blobs, pins, pending int) {
		t.Helper()
		err := e.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM blobs WHERE digest = $1),
			(SELECT count(*) FROM gc_pins WHERE digest = $1 AND owner = $2),
			(SELECT count(*) FROM ns_pending WHERE id = $3 AND digest = $1)`, d[:], owner, int64(i)).Scan(&blobs, &pins, &pending)
		if err != nil {
			t.Fatal(err)
		}
		return
	}

	v := []byte(owner + " fast " + ns)
	d := blob.Sum(v)
	var i namespaces.Intent
	before := postgres.FastBatches(e)
	if ins, err := e.PutRows(ctx, d, v, pend(ns, d, len(v), &i)); err != nil || !ins {
		t.Fatalf("put = %v, %v", ins, err)
	}
	if got := postgres.FastBatches(e) - before; got != 1 {
		t.Fatalf("%d one-statement batches for a put of a pin row and an intent; want 1", got)
	}
	if b, p, n := counts(d, i); b != 1 || p != 1 || n != 1 {
		t.Fatalf("after the put: %d blobs, %d pin rows, %d intents; want one each", b, p, n)
	}

	// A link: a transaction.
	v2 := []byte(owner + " linked " + ns)
	d2 := blob.Sum(v2)
	before = postgres.FastBatches(e)
	link := reg.Join(meta.NSRows{Link: &meta.LinkRow{NS: ns}}).For(d2, int64(len(v2)))
	if _, err := e.PutRows(ctx, d2, v2, meta.Rows{Pin: &meta.PinRow{D: d2, Owner: owner, TTL: time.Minute}, NS: link}); err != nil {
		t.Fatal(err)
	}
	if got := postgres.FastBatches(e) - before; got != 0 {
		t.Fatalf("a put with a link went as a one-statement batch (%d)", got)
	}
	if b, p, _ := counts(d2, 0); b != 1 || p != 1 {
		t.Fatalf("after the put in a transaction: %d blobs, %d pin rows; want one each", b, p)
	}
	if _, ok, err := reg.Has(ctx, ns, d2); err != nil || !ok {
		t.Fatalf("the put's link: Has = %v, %v; want true", ok, err)
	}

	// An absent namespace.
	v3 := []byte(owner + " absent " + ns)
	d3 := blob.Sum(v3)
	_, err := e.PutRows(ctx, d3, v3, pend(ns+"-absent", d3, len(v3), &i))
	if !errors.Is(err, namespaces.ErrNotFound) {
		t.Fatalf("a put with an intent for an absent namespace = %v; want ErrNotFound", err)
	}
	if b, p, n := counts(d3, i); b != 0 || p != 0 || n != 0 {
		t.Fatalf("after the refused put: %d blobs, %d pin rows, %d intents; want none", b, p, n)
	}
}

// TestPutBatchesOverlapFast: two engines (two hosts) whose batches of
// intents into one namespace overlap — every batch runner of both waits
// on the namespace's row, locked by another writer, and the rest of the
// puts queue — all commit as one-statement batches once the row is free:
// they wait for each other rather than fail and run again in
// transactions. The counters are exact. Then the two hosts race for the
// last room of a quota: exactly that many puts are admitted, the others
// refused alone with ErrQuota.
func TestPutBatchesOverlapFast(t *testing.T) {
	dsn := pgtest.DSN(t)
	ctx := t.Context()
	type host struct {
		e   *postgres.Engine
		reg *namespaces.SQL
	}
	var hosts [2]host
	for i := range hosts {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", fmt.Sprint("host", i)) // to tell the hosts' connections apart
		u.RawQuery = q.Encode()
		e := open(t, u.String())
		defer e.Close()
		reg, err := namespaces.OpenSQL(ctx, e, nil)
		if err != nil {
			t.Fatal(err)
		}
		hosts[i] = host{e, reg}
	}
	ns := fmt.Sprint("overlap", time.Now().UnixNano())
	if err := hosts[0].reg.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	owner := t.Name()
	defer hosts[0].e.Meta().Host.DropOwner(context.Background(), owner)
	const perHost, size = 12, 64
	// put puts distinct content of size bytes through h with an intent
	// into ns, on a goroutine, and sends its error.
	put := func(h host, tag string, errs chan<- error) {
		v := fmt.Appendf(nil, "%-*s", size, fmt.Sprint(tag, " ", ns, " ", owner))[:size]
		d := blob.Sum(v)
		go func() {
			pend := meta.NSRows{Intent: &meta.IntentRow{ID: meta.NewIntentID(), NS: ns, Holder: owner, TTL: time.Minute}}
			_, err := h.e.PutRows(ctx, d, v, meta.Rows{Pin: &meta.PinRow{D: d, Owner: owner, TTL: time.Minute}, NS: h.reg.Join(pend).For(d, size)})
			errs <- err
		}()
	}
	usage := func(blobs int64, what string) {
		t.Helper()
		u, err := hosts[1].reg.Usage(ctx, ns)
		if err != nil || u.Blobs != blobs || u.Bytes != blobs*size {
			t.Fatalf("%s: usage = %+v, %v; want %d blobs, %d bytes", what, u, err, blobs, blobs*size)
		}
		if n, err := hosts[1].reg.Recount(ctx); err != nil || n != 0 {
			t.Fatalf("%s: Recount = %d fixed, %v; want 0", what, n, err)
		}
	}

	// Another writer of the namespace holds its row while both hosts'
	// puts start.
	holder, err := hosts[0].e.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(ctx, `SELECT 1 FROM ns WHERE name = $1 FOR NO KEY UPDATE`, ns); err != nil {
		t.Fatal(err)
	}
	var fast, tx [2]int64
	for i, h := range hosts {
		fast[i], tx[i] = postgres.FastBatches(h.e), postgres.TxBatches(h.e)
	}
	errs := make(chan error, 2*perHost)
	for i, h := range hosts {
		for w := range perHost {
			put(h, fmt.Sprint("host", i, " put", w), errs)
		}
	}
	// Each host has a batch waiting on a lock (the first waiter waits for
	// the holder, the others for it: the row's tuple lock); the puts
	// queued behind them make later batches, which overlap too.
	waitFor(t, "both hosts' batches waiting on the namespace's row", func() bool {
		var n int
		if err := hosts[0].e.Pool().QueryRow(ctx, `SELECT count(DISTINCT application_name) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'host%' AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2
	})
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 * perHost {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, h := range hosts {
		if got := postgres.TxBatches(h.e) - tx[i]; got != 0 {
			t.Errorf("host %d: %d overlapping batches ran again in a transaction; want none", i, got)
		}
		if got := postgres.FastBatches(h.e) - fast[i]; got < 1 {
			t.Errorf("host %d: no one-statement batch for %d puts", i, perHost)
		}
	}
	usage(2*perHost, "after the overlapping puts")

	// The quota race across hosts.
	const room = 5
	if err := hosts[0].reg.SetQuota(ctx, ns, namespaces.Quota{Blobs: 2*perHost + room}); err != nil {
		t.Fatal(err)
	}
	for i, h := range hosts {
		for w := range perHost {
			put(h, fmt.Sprint("host", i, " race", w), errs)
		}
	}
	admitted := 0
	for range 2 * perHost {
		switch err := <-errs; {
		case err == nil:
			admitted++
		case !errors.Is(err, blob.ErrQuota):
			t.Fatalf("a put racing for the quota = %v; want nil or ErrQuota", err)
		}
	}
	if admitted != room {
		t.Fatalf("%d puts admitted racing for %d blobs of room", admitted, room)
	}
	usage(2*perHost+room, "after the quota race")
}

// TestPutReplacingIntentDropsTheOld: a put whose intent replaces the
// writer's earlier one (a file closed again) commits in a transaction,
// where the earlier intent is dropped before the new one is charged; the
// one-statement batch, which records intents only, would keep both.
func TestPutReplacingIntentDropsTheOld(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	reg, ns := namespaceIn(t, e, "replace")
	put := func(v string, id, replaces int64) {
		t.Helper()
		d := blob.Sum([]byte(v))
		part := meta.NSRows{Intent: &meta.IntentRow{ID: id, NS: ns, Holder: t.Name(), TTL: time.Minute}, Replaces: replaces}
		if _, err := e.PutRows(ctx, d, []byte(v), meta.Rows{NS: reg.Join(part).For(d, int64(len(v)))}); err != nil {
			t.Fatal(err)
		}
	}
	pending := func(id int64) int {
		t.Helper()
		var n int
		if err := e.Pool().QueryRow(ctx, `SELECT count(*) FROM ns_pending WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	first, second := meta.NewIntentID(), meta.NewIntentID()
	put(ns+" version one", first, 0)
	before := postgres.FastBatches(e)
	put(ns+" version two", second, first)
	if got := postgres.FastBatches(e) - before; got != 0 {
		t.Errorf("a put whose intent replaces another went as a one-statement batch (%d)", got)
	}
	if n := pending(first); n != 0 {
		t.Errorf("the replaced intent is still pending (%d rows)", n)
	}
	if n := pending(second); n != 1 {
		t.Errorf("the replacing intent: %d rows pending; want 1", n)
	}
}

// namespaceIn opens e's namespace registry and creates a namespace of
// its own in it, named prefix and the time.
func namespaceIn(t *testing.T, e *postgres.Engine, prefix string) (*namespaces.SQL, string) {
	t.Helper()
	reg, err := namespaces.OpenSQL(t.Context(), e, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprint(prefix, time.Now().UnixNano())
	if err := reg.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return reg, ns
}
