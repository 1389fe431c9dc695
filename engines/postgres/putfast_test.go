package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestPutBatchOneStatement: a put whose callback asks only for a pin row
// and a namespace intent commits as one statement (no transaction of its
// own), with its blob, pin row and intent; one whose callback runs a
// statement of its own commits in a transaction, as before. An intent for
// an absent namespace fails its put with the registry's ErrNotFound and
// commits nothing: the one-statement batch, refused by the server (the
// foreign key), runs again in a transaction, where the registry's own
// statement tells.
func TestPutBatchOneStatement(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	reg, err := namespaces.OpenSQL(ctx, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprint("fast", time.Now().UnixNano())
	if err := reg.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	owner := t.Name()
	defer e.Meta().Host.DropOwner(context.Background(), owner)
	pend := func(name string, d blob.Digest, out *namespaces.Intent) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			if err := e.Meta().Host.PinRows(ctx, tx, owner, []blob.Digest{d}, time.Minute); err != nil {
				return err
			}
			i, err := reg.PendTx(ctx, tx, name, d, namespaces.Pending{Holder: owner, TTL: time.Minute})
			*out = i
			return err
		}
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
	if ins, err := e.PutTx(ctx, d, v, pend(ns, d, &i)); err != nil || !ins {
		t.Fatalf("put = %v, %v", ins, err)
	}
	if got := postgres.FastBatches(e) - before; got != 1 {
		t.Fatalf("%d one-statement batches for a put of a pin row and an intent; want 1", got)
	}
	if b, p, n := counts(d, i); b != 1 || p != 1 || n != 1 {
		t.Fatalf("after the put: %d blobs, %d pin rows, %d intents; want one each", b, p, n)
	}

	// A callback with a statement of its own: a transaction.
	v2 := []byte(owner + " own statement " + ns)
	d2 := blob.Sum(v2)
	before = postgres.FastBatches(e)
	if _, err := e.PutTx(ctx, d2, v2, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT 1`); err != nil {
			return err
		}
		return pend(ns, d2, &i)(ctx, tx)
	}); err != nil {
		t.Fatal(err)
	}
	if got := postgres.FastBatches(e) - before; got != 0 {
		t.Fatalf("a put whose callback runs a statement went as a one-statement batch (%d)", got)
	}
	if b, p, n := counts(d2, i); b != 1 || p != 1 || n != 1 {
		t.Fatalf("after the put in a transaction: %d blobs, %d pin rows, %d intents; want one each", b, p, n)
	}

	// An absent namespace.
	v3 := []byte(owner + " absent " + ns)
	d3 := blob.Sum(v3)
	_, err = e.PutTx(ctx, d3, v3, pend(ns+"-absent", d3, &i))
	if !errors.Is(err, namespaces.ErrNotFound) {
		t.Fatalf("a put with an intent for an absent namespace = %v; want ErrNotFound", err)
	}
	if b, p, n := counts(d3, i); b != 0 || p != 0 || n != 0 {
		t.Fatalf("after the refused put: %d blobs, %d pin rows, %d intents; want none", b, p, n)
	}
}
