package namespaces_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestPostgresOpenBesideWriters: opening a store whose schema exists
// waits for no writer. Its CREATE INDEX IF NOT EXISTS statements took a
// SHARE lock on their tables even when the index existed, so an open (a
// CLI command beside a busy mount) waited for every open write
// transaction on ns_refs and ns_pending, and deadlocked with one that
// held one table and wanted the other (40P01 in TestFleetAcceptance).
func TestPostgresOpenBesideWriters(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DSN(t)
	r, _ := openPostgres(t, dsn, nil)
	if err := r.Create(ctx, "busy"); err != nil {
		t.Fatal(err)
	}

	// A writer in the middle of its transaction, holding ROW EXCLUSIVE
	// on the namespaces' tables and the GC's pin table.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	d := blob.Sum([]byte("written"))
	for _, q := range []string{
		`INSERT INTO ns_refs (ns, digest, linked_at) VALUES ('busy', $1, 0)`,
		`INSERT INTO ns_pending (id, ns, digest, holder, expiry) VALUES (1, 'busy', $1, 'h', 0)`,
		`INSERT INTO gc_pins (digest, owner, expiry) VALUES ($1, 'o', 0)`,
	} {
		if _, err := tx.Exec(ctx, q, d[:]); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	done := make(chan error, 1)
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	go func() {
		e, err := postgres.Open(octx, dsn)
		if err != nil {
			done <- err
			return
		}
		defer e.Close()
		_, err = namespaces.OpenSQL(octx, e, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("open beside a writer: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("opening the engine and the registry still waits for a writer's transaction after 5s")
	}
}
