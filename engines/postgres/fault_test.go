package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestServerRestart: a transaction open across a restart fails and leaves
// nothing; the next operations on the same engine — pgx and database/sql
// alike — succeed at once.
func TestServerRestart(t *testing.T) {
	f := pgtest.FaultServer(t)
	e := open(t, f.DSN)
	t.Cleanup(func() { e.Close() })
	ctx := t.Context()
	old := []byte("before the restart")
	if _, err := e.Put(ctx, blob.Sum(old), old); err != nil {
		t.Fatal(err)
	}
	// Idle pooled connections, all of which the restart kills. The restart
	// is quicker than pgxpool's 1 s idle-ping rule: these must be caught
	// some other way.
	pgtest.Warm(t, e.Pool(), 6)

	v := []byte("in flight across the restart")
	d := blob.Sum(v)
	// A put with a link takes the transaction path (a batch of pin rows
	// and intents only is one statement, with no transaction to cut;
	// putfast.go): its link is written, and its batch statement waits on
	// the digest's arbitration lock, which an arbitration holds, when the
	// server restarts.
	reg, err := namespaces.OpenSQL(ctx, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Create(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	inArb, release := make(chan struct{}), make(chan struct{})
	arbDone := make(chan error, 1)
	go func() {
		arbDone <- holdArbitration(ctx, e, []blob.Digest{d}, func(context.Context, []blob.Digest) error {
			close(inArb)
			<-release
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
	putDone := make(chan error, 1)
	go func() {
		rows := meta.Rows{
			Pin: &meta.PinRow{D: d, Owner: t.Name(), TTL: time.Minute},
			NS:  reg.Join(meta.NSRows{Link: &meta.LinkRow{NS: "a"}}).For(d, int64(len(v))),
		}
		_, err := e.PutRows(ctx, d, v, rows)
		putDone <- err
	}()
	waitFor(t, "the put to wait for the arbitration lock", func() bool { return lockWaits(t, e) > 0 })
	f.Restart(t)
	close(release)
	select {
	case <-arbDone: // cut by the restart too
	case <-time.After(30 * time.Second):
		t.Fatal("the arbitration cut by a restart never returned")
	}
	select {
	case err = <-putDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the put cut by a restart never returned")
	}
	// The restart ends every session, but in no set order: when the
	// arbitration's ends first, its lock goes with it, and the put's
	// statement and COMMIT may go through before the put's own session is
	// ended (a few runs in forty here). Either way the put's answer is the
	// truth: an error naming the engine and nothing stored, or success and
	// its blob stored.
	putErr := err
	cut := putErr != nil
	if cut {
		t.Logf("in-flight put: %v", putErr)
		if !strings.Contains(putErr.Error(), e.Name()) {
			t.Errorf("error does not name the engine: %v", putErr)
		}
	} else {
		t.Log("the put committed before the restart ended its session")
	}

	// Each of these is the first use of a pooled connection since the
	// restart; none may fail.
	if ok, err := e.Has(ctx, d); ok == cut || err != nil {
		t.Fatalf("Has(put across the restart) = %v, %v; want %v, nil (the put's answer: %v)", ok, err, !cut, putErr)
	}
	if n, err := e.Size(ctx, blob.Sum(old)); err != nil || n != int64(len(old)) {
		t.Fatalf("Size after restart = %d, %v", n, err)
	}
	if ins, err := e.Put(ctx, d, v); ins != cut || err != nil {
		t.Fatalf("Put after restart = %v, %v; want %v, nil", ins, err, cut)
	}
	var n int
	if err := e.DB().QueryRowContext(ctx, `SELECT count(*) FROM blobs`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("database/sql after restart: %d rows, %v; want 2", n, err)
	}
	listed := 0
	for _, err := range e.List(ctx, blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		listed++
	}
	if listed != 2 {
		t.Fatalf("listed %d entries; want 2", listed)
	}
}

// TestServerDown: errors name the server's address and do not read as a
// missing blob; the same engine works once the server is back.
func TestServerDown(t *testing.T) {
	f := pgtest.FaultServer(t)
	e := open(t, f.DSN)
	t.Cleanup(func() { e.Close() })
	v := []byte("x")
	d := blob.Sum(v)
	if _, err := e.Put(t.Context(), d, v); err != nil {
		t.Fatal(err)
	}
	pgtest.Warm(t, e.Pool(), 4)
	f.Stop(t)
	for _, op := range []func() error{
		func() error { _, err := e.Has(t.Context(), d); return err },
		func() error { _, err := e.Open(t.Context(), d); return err },
		func() error { _, err := e.Put(t.Context(), blob.Sum(nil), nil); return err },
	} {
		err := op()
		if err == nil {
			t.Fatal("an operation with the server down succeeded")
		}
		if !strings.Contains(err.Error(), e.Server().Addr()) || errors.Is(err, blob.ErrMissing) {
			t.Errorf("server down: %v; want an error naming %s, not ErrMissing", err, e.Server().Addr())
		}
	}
	f.Start(t)
	if ok, err := e.Has(t.Context(), d); !ok || err != nil {
		t.Fatalf("Has after the server came back = %v, %v", ok, err)
	}
}
