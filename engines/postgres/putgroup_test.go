package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after 10 s waiting for %s", what)
		}
	}
}

type putResult struct {
	name     string
	inserted bool
	err      error
}

// TestPutGroupRerunsAlone: puts that queue behind busy batches share one
// transaction; when one of them fails (and PostgreSQL aborts that
// transaction), the others still commit — their blobs, their links and
// their pin rows — and the failing one commits nothing. Two puts of one
// content in a batch insert it once.
func TestPutGroupRerunsAlone(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	reg, err := namespaces.OpenSQL(ctx, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("%s %d", t.Name(), time.Now().UnixNano())
	ns := fmt.Sprint("rerun", time.Now().UnixNano())
	if err := reg.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	results := make(chan putResult, 8)
	put := func(name string, v []byte, rows meta.Rows) {
		go func() {
			ins, err := e.PutRows(ctx, blob.Sum(v), v, rows)
			results <- putResult{name, ins, err}
		}()
	}
	pinned := func(d blob.Digest) meta.Rows {
		return meta.Rows{Pin: &meta.PinRow{D: d, Owner: "putter", TTL: time.Minute}}
	}
	// Hold every batch runner inside a put of its own: each holder's pin
	// row waits on its digest's arbitration lock, which an arbitration
	// holds until hold closes.
	var holders []blob.Digest
	for i := range postgres.PutRunners {
		holders = append(holders, blob.Sum([]byte(fmt.Sprint(tag, " holder ", i))))
	}
	inArb, hold, arbDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	letGo := func() { once.Do(func() { close(hold) }) }
	defer letGo() // before e.Close, which waits for the puts
	go func() {
		arbDone <- holdArbitration(ctx, e, holders, func(context.Context, []blob.Digest) error {
			close(inArb)
			<-hold
			return nil
		})
	}()
	select {
	case <-inArb:
	case err := <-arbDone:
		t.Fatalf("Arbitrate: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the arbitration never ran")
	}
	for i := range postgres.PutRunners {
		v := []byte(fmt.Sprint(tag, " holder ", i))
		put(fmt.Sprint("holder", i), v, pinned(blob.Sum(v)))
		waitFor(t, fmt.Sprint("holder ", i, " to wait for its arbitration lock"), func() bool { return lockWaits(t, e) == i+1 })
	}
	linked := func(d blob.Digest, size int, name string) meta.Rows {
		rows := pinned(d)
		rows.NS = reg.Join(meta.NSRows{Link: &meta.LinkRow{NS: name}}).For(d, int64(size))
		return rows
	}
	va, vb, vbad := []byte(tag+" a"), []byte(tag+" b"), []byte(tag+" bad")
	da, db, dbad := blob.Sum(va), blob.Sum(vb), blob.Sum(vbad)
	put("a", va, linked(da, len(va), ns))
	put("b", vb, linked(db, len(vb), ns))
	put("b again", vb, linked(db, len(vb), ns))
	put("bad", vbad, linked(dbad, len(vbad), ns+"-absent"))
	waitFor(t, "four puts queued behind the held batches", func() bool { return postgres.QueuedPuts(e) == 4 })
	letGo()
	select {
	case err := <-arbDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the arbitration still held 30 s after it was let go")
	}
	got := make(map[string]putResult)
	for range 6 {
		select {
		case r := <-results:
			got[r.name] = r
		case <-time.After(30 * time.Second):
			t.Fatalf("puts still running after 30 s; returned: %v", got)
		}
	}
	if r := got["bad"]; !errors.Is(r.err, namespaces.ErrNotFound) {
		t.Fatalf("the failing put = %v, %v; want its own ErrNotFound", r.inserted, r.err)
	}
	for _, n := range []string{"a", "b", "b again"} {
		if got[n].err != nil {
			t.Fatalf("put %q beside a failing one = %v", n, got[n].err)
		}
	}
	if !got["a"].inserted || got["b"].inserted == got["b again"].inserted {
		t.Fatalf("inserted: a %v, b %v, b again %v; want a, and one of the two b", got["a"].inserted, got["b"].inserted, got["b again"].inserted)
	}
	for d, want := range map[blob.Digest]bool{da: true, db: true, dbad: false} {
		if ok, err := e.Has(ctx, d); ok != want || err != nil {
			t.Fatalf("Has(%s) = %v, %v; want %v", d, ok, err, want)
		}
	}
	if n, err := reg.Count(ctx, ns); err != nil || n != 2 {
		t.Fatalf("links = %d, %v; want those of a and b", n, err)
	}
	if pinned := pinnedNow(t, e, da, db, dbad); !pinned[da] || !pinned[db] || pinned[dbad] {
		t.Fatalf("pinned = %v; want a and b only", pinned)
	}
	if err := e.Meta().Host.DropOwner(ctx, "putter"); err != nil {
		t.Fatal(err)
	}
}

// holdArbitration arbitrates ds and runs fn under the arbitration lock
// with the digests nothing protects (meta.Arbitration.Outside), which it
// deletes nothing of.
func holdArbitration(ctx context.Context, e *postgres.Engine, ds []blob.Digest, fn func(ctx context.Context, ds []blob.Digest) error) error {
	_, err := e.Meta().Host.Arbitrate(ctx, meta.Arbitration{Digests: ds, Outside: func(ctx context.Context, ds []blob.Digest) ([]int64, error) {
		sizes := make([]int64, len(ds))
		for i := range sizes {
			sizes[i] = meta.NotHeld
		}
		return sizes, fn(ctx, ds)
	}})
	return err
}

// pinnedNow returns which of ds a pin row protects now, as an arbitration
// reads them.
func pinnedNow(t *testing.T, e *postgres.Engine, ds ...blob.Digest) map[blob.Digest]bool {
	t.Helper()
	out, err := e.Meta().Host.Arbitrate(t.Context(), meta.Arbitration{Digests: ds, Outside: func(_ context.Context, ds []blob.Digest) ([]int64, error) {
		return make([]int64, len(ds)), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[blob.Digest]bool)
	for i, n := range out {
		got[ds[i]] = n == meta.Protected
	}
	return got
}

// lockWaits counts the advisory locks of this database that a session
// waits for.
func lockWaits(t *testing.T, e *postgres.Engine) int {
	t.Helper()
	var n int
	err := e.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPutGroupWaitsForArbitration: a put of a blob whose delete's
// arbitration has deleted its row and not yet committed waits for the
// commit on the digest's lock, then stores the content afresh, with its
// pin row: its insert judges on the latest committed rows (ON CONFLICT),
// not on its statement's snapshot, taken while the row was still there.
func TestPutGroupWaitsForArbitration(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	v := []byte(fmt.Sprintf("%s %d", t.Name(), time.Now().UnixNano()))
	d := blob.Sum(v)
	if _, err := e.Put(ctx, d, v); err != nil {
		t.Fatal(err)
	}
	// The arbitration's delete waits, uncommitted and under the digest's
	// exclusive lock, in a trigger on the deleted row for an advisory lock
	// this test holds. Its key is a pair of ints, a space of keys apart
	// from the arbitration locks' bigints.
	hold, err := e.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	if _, err := hold.Exec(ctx, `SELECT pg_advisory_lock(36, 4)`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	letGo := func() {
		once.Do(func() {
			if _, err := hold.Exec(context.Background(), `SELECT pg_advisory_unlock(36, 4)`); err != nil {
				t.Error(err)
			}
		})
	}
	defer letGo() // before e.Close, which waits for the put
	for _, q := range []string{
		`CREATE FUNCTION test_hold_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(36, 4); RETURN OLD; END $$`,
		`CREATE TRIGGER test_hold_delete AFTER DELETE ON blobs FOR EACH ROW EXECUTE FUNCTION test_hold_delete()`,
	} {
		if _, err := e.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	type arbResult struct {
		out []int64
		err error
	}
	arbDone := make(chan arbResult, 1)
	go func() {
		out, err := e.Meta().Host.Arbitrate(ctx, meta.Arbitration{Digests: []blob.Digest{d}})
		arbDone <- arbResult{out, err}
	}()
	waitFor(t, "the arbitration's delete to wait in the trigger", func() bool { return lockWaits(t, e) == 1 })
	putDone := make(chan putResult, 1)
	go func() {
		ins, err := e.PutRows(ctx, d, v, meta.Rows{Pin: &meta.PinRow{D: d, Owner: "putter", TTL: time.Minute}})
		putDone <- putResult{"put", ins, err}
	}()
	waitFor(t, "the put to wait for the arbitration lock", func() bool { return lockWaits(t, e) == 2 })
	select {
	case r := <-putDone:
		t.Fatalf("the put returned (%v, %v) while the arbitration held its lock", r.inserted, r.err)
	case r := <-arbDone:
		t.Fatalf("the arbitration returned (%v, %v) while its delete waited", r.out, r.err)
	default:
	}
	letGo()
	select {
	case r := <-arbDone:
		if r.err != nil || len(r.out) != 1 || r.out[0] != int64(len(v)) {
			t.Fatalf("Arbitrate = %v, %v; want the blob deleted (%d bytes)", r.out, r.err, len(v))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the arbitration had not returned 30 s after its delete was let go")
	}
	select {
	case r := <-putDone:
		if !r.inserted || r.err != nil {
			t.Fatalf("the put after the delete = %v, %v; want the content inserted afresh", r.inserted, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the put never returned after the arbitration committed")
	}
	if !pinnedNow(t, e, d)[d] {
		t.Fatal("the put's pin row is missing")
	}
	if ok, err := e.Has(ctx, d); !ok || err != nil {
		t.Fatalf("Has after the put = %v, %v", ok, err)
	}
	e.Meta().Host.DropOwner(ctx, "putter")
}
