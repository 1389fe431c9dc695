package meta_test

import (
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/pglo"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/meta/metatest"
)

// The PostgreSQL dialect through the engines that open it: the kv engine
// keeps every part, pglo the delete window alone.

func openPG(t *testing.T, dsn string) *postgres.Engine {
	t.Helper()
	e, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func openPglo(t *testing.T, dsn string) *pglo.Engine {
	t.Helper()
	e, err := pglo.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestPostgresHost(t *testing.T) {
	dsn := pgtest.DSN(t)
	metatest.Host(t, func(t *testing.T) engines.Engine { return openPG(t, dsn) })
}

// TestPostgresOpenNeedsBlobDelete: a Host opened without the engine's
// blob delete could delete no dead blob; the open says what is missing.
func TestPostgresOpenNeedsBlobDelete(t *testing.T) {
	e := openPG(t, pgtest.DSN(t))
	defer e.Close()
	_, err := meta.OpenPostgres(t.Context(), meta.PostgresConfig{Name: e.Name(), Pool: e.Pool(), DB: e.DB()})
	if err == nil || !strings.Contains(err.Error(), "no BlobDelete") || !strings.Contains(err.Error(), e.Name()) {
		t.Fatalf("OpenPostgres without BlobDelete = %v; want an error naming the engine and what is missing", err)
	}
}

func TestPostgresWindow(t *testing.T) {
	metatest.WindowEngine(t, func(t *testing.T) engines.Engine { return openPG(t, pgtest.DSN(t)) })
}

func TestPostgresLedger(t *testing.T) {
	dsn := pgtest.DSN(t)
	metatest.Ledger(t, func(t *testing.T) engines.Engine { return openPG(t, dsn) })
}

// TestPostgresReopen: the delete window is durable across a close.
func TestPostgresReopen(t *testing.T) {
	dsn := pgtest.DSN(t)
	metatest.Reopen(t, func(t *testing.T) engines.Engine { return openPG(t, dsn) })
}

// TestPgloWindow: a large engine's database keeps the window too.
func TestPgloWindow(t *testing.T) {
	metatest.WindowEngine(t, func(t *testing.T) engines.Engine { return openPglo(t, pgtest.DSN(t)) })
}

// TestPgloReopen: pglo's delete window is durable across a close.
func TestPgloReopen(t *testing.T) {
	dsn := pgtest.DSN(t)
	metatest.Reopen(t, func(t *testing.T) engines.Engine { return openPglo(t, dsn) })
}

// TestPostgresSweepLeaseLost: the sweep lease is a session lock; when the server
// ends the session (as a restart does), Check reports the loss, and
// another process can take the lease.
func TestPostgresSweepLeaseLost(t *testing.T) {
	dsn := pgtest.DSN(t)
	e, other := openPG(t, dsn), openPG(t, dsn)
	defer e.Close()
	defer other.Close()
	ctx := t.Context()
	l, held, err := e.Meta().Host.SweepLease(ctx)
	if err != nil || !held {
		t.Fatalf("SweepLease: %v, %v", held, err)
	}
	defer l.Release()
	if err := l.Check(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	// pg_locks shows every database's locks: the tests of other
	// packages, each on a database of its own, sweep on the same server.
	if err := other.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 2 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminating the lease's session: %d, %v", n, err)
	}
	if err := l.Check(ctx); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("Check after the session ended = %v; want the lease lost", err)
	}
	// The server ends the session just after pg_terminate_backend returns.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l2, held, err := other.Meta().Host.SweepLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if held {
			l2.Release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease of an ended session was never free again")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
