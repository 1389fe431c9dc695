package namespaces_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/namespaces/nstest"
)

func TestBusWatch(t *testing.T) {
	nstest.RunWatch(t, func(t *testing.T) (namespaces.Registry, namespaces.Registry) {
		bus, m := namespaces.NewBus(), namespaces.NewMem(nil)
		return bus.Join(m), bus.Join(m)
	})
}

func TestPostgresWatch(t *testing.T) {
	nstest.RunWatch(t, func(t *testing.T) (namespaces.Registry, namespaces.Registry) {
		dsn := pgtest.DSN(t)
		a, _ := openPostgres(t, dsn, nil)
		b, _ := openPostgres(t, dsn, nil)
		return a, b
	})
}

// TestSQLiteWatch: SQLite has no feed, and says so.
func TestSQLiteWatch(t *testing.T) {
	if _, err := openSQLite(t, nil).Watch(t.Context()); !errors.Is(err, namespaces.ErrNoFeed) {
		t.Fatalf("Watch on SQLite: %v, want ErrNoFeed", err)
	}
}

// TestPostgresWatchReconnect: when the server ends the listener's session,
// the feed reconnects, says a Resync with the error, and goes on
// reporting.
func TestPostgresWatchReconnect(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, _ := openPostgres(t, dsn, nil)
	b, _ := openPostgres(t, dsn, nil)
	ch, err := b.Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if c := nstest.NextChange(t, ch); c.Kind != namespaces.Resync || c.Err != nil {
		t.Fatalf("first change %v, want a resync without error", c)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminating the listener: %d sessions, %v", n, err)
	}
	c := nstest.NextChange(t, ch)
	if c.Kind != namespaces.Resync || c.Err == nil {
		t.Fatalf("after the listener's session ended: %v, want a resync with the error", c)
	}
	t.Logf("resync after: %v", c.Err)
	if err := a.Create(t.Context(), "after"); err != nil {
		t.Fatal(err)
	}
	if c := nstest.NextChange(t, ch); c.Kind != namespaces.Created || c.Namespace != "after" {
		t.Fatalf("after the reconnection: %v, want created after", c)
	}
}
