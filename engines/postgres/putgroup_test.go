package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
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
// transaction), the others still commit — their blobs, the rows their
// callbacks wrote and the pin rows they asked for — and the failing one
// commits nothing. Two puts of one content in a batch insert it once.
func TestPutGroupRerunsAlone(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	if _, err := e.Pool().Exec(ctx, `CREATE TABLE IF NOT EXISTS putgroup_test (k TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("%s %d", t.Name(), time.Now().UnixNano())
	results := make(chan putResult, 8)
	put := func(name string, v []byte, also func(context.Context, *sql.Tx) error) {
		go func() {
			ins, err := e.PutTx(ctx, blob.Sum(v), v, also)
			results <- putResult{name, ins, err}
		}()
	}
	// Hold every batch runner inside a put of its own.
	entered, hold := make(chan struct{}), make(chan struct{})
	for i := range 2 {
		put(fmt.Sprint("holder", i), []byte(fmt.Sprint(tag, " holder ", i)), func(context.Context, *sql.Tx) error {
			entered <- struct{}{}
			<-hold
			return nil
		})
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("holder %d never ran", i)
		}
	}
	good := func(k string, d blob.Digest) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO putgroup_test (k) VALUES ($1)`, k); err != nil {
				return err
			}
			return e.Meta().Host.PinRows(ctx, tx, "putter", []blob.Digest{d}, time.Minute)
		}
	}
	va, vb, vbad := []byte(tag+" a"), []byte(tag+" b"), []byte(tag+" bad")
	da, db, dbad := blob.Sum(va), blob.Sum(vb), blob.Sum(vbad)
	put("a", va, good(tag+" a", da))
	put("b", vb, good(tag+" b", db))
	put("b again", vb, good(tag+" b again", db))
	put("bad", vbad, func(ctx context.Context, tx *sql.Tx) error {
		if err := good(tag+" bad", dbad)(ctx, tx); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `SELECT 1 / 0`)
		return err
	})
	waitFor(t, "four puts queued behind the held batches", func() bool { return postgres.QueuedPuts(e) == 4 })
	close(hold)
	got := make(map[string]putResult)
	for range 6 {
		select {
		case r := <-results:
			got[r.name] = r
		case <-time.After(30 * time.Second):
			t.Fatalf("puts still running after 30 s; returned: %v", got)
		}
	}
	if r := got["bad"]; r.err == nil || !strings.Contains(r.err.Error(), "division by zero") {
		t.Fatalf("the failing put = %v, %v; want its own division by zero", r.inserted, r.err)
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
	var rows int
	if err := e.Pool().QueryRow(ctx, `SELECT count(*) FROM putgroup_test WHERE k LIKE $1`, tag+"%").Scan(&rows); err != nil || rows != 3 {
		t.Fatalf("callback rows = %d, %v; want those of a, b and b again", rows, err)
	}
	err := e.Meta().Host.Arbitrate(ctx, []blob.Digest{da, db, dbad}, func(ctx context.Context, tx *sql.Tx) error {
		pinned, err := e.Meta().Host.PinnedAmong(ctx, tx, []blob.Digest{da, db, dbad}, "nobody")
		if err == nil && (!pinned[da] || !pinned[db] || pinned[dbad]) {
			err = fmt.Errorf("pinned = %v; want a and b only", pinned)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Meta().Host.DropOwner(ctx, "putter"); err != nil {
		t.Fatal(err)
	}
}

// TestPutGroupWaitsForArbitration: a put of a blob that a delete's
// arbitration holds waits for the arbitration's commit on the digest's
// lock, then stores the content afresh, with its pin row.
func TestPutGroupWaitsForArbitration(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	v := []byte(fmt.Sprintf("%s %d", t.Name(), time.Now().UnixNano()))
	d := blob.Sum(v)
	if _, err := e.Put(ctx, d, v); err != nil {
		t.Fatal(err)
	}
	inArb, release, arbDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo() // before e.Close, which waits for the put
	go func() {
		arbDone <- e.Meta().Host.Arbitrate(ctx, []blob.Digest{d}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := e.DeleteManyTx(ctx, tx, []blob.Digest{d})
			close(inArb)
			<-release
			return err
		})
	}()
	select {
	case <-inArb:
	case err := <-arbDone:
		t.Fatalf("Arbitrate: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the arbitration never ran")
	}
	putDone := make(chan putResult, 1)
	go func() {
		ins, err := e.PutTx(ctx, d, v, func(ctx context.Context, tx *sql.Tx) error {
			return e.Meta().Host.PinRows(ctx, tx, "putter", []blob.Digest{d}, time.Minute)
		})
		putDone <- putResult{"put", ins, err}
	}()
	waitFor(t, "the put to wait for the arbitration lock", func() bool {
		var n int
		err := e.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return err == nil && n > 0
	})
	select {
	case r := <-putDone:
		t.Fatalf("the put returned (%v, %v) while the arbitration held its lock", r.inserted, r.err)
	default:
	}
	letGo()
	if err := <-arbDone; err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-putDone:
		if !r.inserted || r.err != nil {
			t.Fatalf("the put after the delete = %v, %v; want the content inserted afresh", r.inserted, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the put never returned after the arbitration committed")
	}
	checkPinned := func(tx *sql.Tx) error {
		pinned, err := e.Meta().Host.PinnedAmong(ctx, tx, []blob.Digest{d}, "nobody")
		if err == nil && !pinned[d] {
			err = errors.New("the put's pin row is missing")
		}
		return err
	}
	if err := e.Meta().Host.Arbitrate(ctx, []blob.Digest{d}, func(_ context.Context, tx *sql.Tx) error { return checkPinned(tx) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.Has(ctx, d); !ok || err != nil {
		t.Fatalf("Has after the put = %v, %v", ok, err)
	}
	e.Meta().Host.DropOwner(ctx, "putter")
}
