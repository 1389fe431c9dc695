package namespaces_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestPendCommitLost: the COMMIT of an intent reaches PostgreSQL and
// commits, and its answer is lost (a connection reset just after it): the
// writer sees an error, and its close fails. Pend returns the intent with
// the error, and Lease.Abandon drops it; it is never linked, neither by
// the lease's ticks nor at its Close. Before, the row stayed pending under
// the live holder, renewed every tick, and the lease's Close linked it: a
// close that had failed published at unmount (and TestFleetAcceptance's
// "no pending rows" waited for the unmount).
func TestPendCommitLost(t *testing.T) {
	ctx := t.Context()
	e, err := postgres.Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	var lose atomic.Bool
	db := sql.OpenDB(lostCommits{stdlib.GetPoolConnector(e.Pool()), &lose})
	t.Cleanup(func() { db.Close() })
	r, err := namespaces.OpenSQL(ctx, sqlOn{db}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Create(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	l, err := namespaces.OpenLease(ctx, namespaces.LeaseConfig{Registry: r, Name: "test:lost", TTL: 300 * time.Millisecond, LockDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	pending := func(i namespaces.Intent) bool {
		var n int
		if err := e.Pool().QueryRow(ctx, `SELECT count(*) FROM ns_pending WHERE id = $1`, int64(i)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	d := blob.Sum([]byte("a close that failed"))
	lose.Store(true)
	i, err := r.Pend(ctx, "p", d, l.Pending(0))
	lose.Store(false)
	if !errors.Is(err, errCommitLost) {
		t.Fatalf("Pend with its COMMIT's answer lost: %v, want the lost answer's error", err)
	}
	if i == 0 {
		t.Fatal("Pend with its COMMIT's answer lost returned no intent: nothing can drop the row it committed")
	}
	if !pending(i) {
		t.Fatal("the COMMIT did not commit: the test's driver does not lose what it should")
	}
	l.Abandon(i)
	start := time.Now()
	for pending(i) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("an abandoned intent still pending after 5s (the lease ticks every 100ms)")
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r.Has(ctx, "p", d); err != nil || ok {
		t.Fatalf("the version of a close that failed: linked = %v (%v) after the lease closed; want never linked", ok, err)
	}
}

var errCommitLost = errors.New("test: the COMMIT's answer was lost")

// sqlOn is an engines.SQL on db (PostgreSQL).
type sqlOn struct{ db *sql.DB }

func (s sqlOn) DB() *sql.DB     { return s.db }
func (s sqlOn) Dialect() string { return "postgres" }

// lostCommits is a connector whose transactions, while lose is set, commit
// and then report errCommitLost, as a client whose connection was reset
// after the server committed.
type lostCommits struct {
	driver.Connector
	lose *atomic.Bool
}

// pgxConn is what database/sql uses of a pgx stdlib connection.
type pgxConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.NamedValueChecker
	driver.Pinger
	driver.SessionResetter
}

func (c lostCommits) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return lostCommitConn{cn.(pgxConn), c.lose}, nil
}

type lostCommitConn struct {
	pgxConn
	lose *atomic.Bool
}

func (c lostCommitConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	tx, err := c.pgxConn.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return lostCommitTx{tx, c.lose}, nil
}

type lostCommitTx struct {
	driver.Tx
	lose *atomic.Bool
}

func (t lostCommitTx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	if t.lose.Load() {
		return errCommitLost
	}
	return nil
}
