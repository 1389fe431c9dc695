package namespaces_test

import (
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/namespaces/nstest"
)

func TestPostgres(t *testing.T) {
	nstest.Run(t, func(t *testing.T, c namespaces.Clock) namespaces.Registry {
		r, _ := openPostgres(t, pgtest.DSN(t), c)
		return r
	})
}

// openPostgres returns a registry in the postgres engine's database, as
// namespaces.Open wires it for a store.
func openPostgres(t *testing.T, dsn string, c namespaces.Clock) (*namespaces.SQL, *postgres.Engine) {
	t.Helper()
	e, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	r, err := namespaces.OpenSQL(t.Context(), e, c)
	if err != nil {
		t.Fatal(err)
	}
	return r, e
}

// TestPostgresPersists: references survive a reopen, with LinkedAt to the
// nanosecond, and Open picks the SQL registry for the postgres engine.
func TestPostgresPersists(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.DSN(t)
	clock := nstest.NewClock(time.Unix(1_700_000_000, 123456789))
	r, e := openPostgres(t, dsn, clock)
	if err := r.Create(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	d := blob.Sum([]byte("persisted"))
	if _, err := r.Link(ctx, "keep", d); err != nil {
		t.Fatal(err)
	}
	e.Close()

	_, e = openPostgres(t, dsn, nil)
	reg, err := namespaces.Open(ctx, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := reg.(*namespaces.SQL); !ok {
		t.Fatalf("Open(postgres engine) = %T, want *namespaces.SQL", reg)
	}
	ref, ok, err := reg.Has(ctx, "keep", d)
	if err != nil || !ok || !ref.LinkedAt.Equal(clock.Now()) {
		t.Fatalf("after reopen: Has = %v, %v, %v; want linked at %v", ref, ok, err, clock.Now())
	}
}

// TestPostgresNSRowsCommitWithEntry: a put's namespace part commits with its entry
// or not at all (testNSRowsCommitWithEntry).
func TestPostgresNSRowsCommitWithEntry(t *testing.T) {
	r, e := openPostgres(t, pgtest.DSN(t), nil)
	testNSRowsCommitWithEntry(t, r, e)
}

// TestPostgresUsage: two registries on one database, each with its own
// engine and connection pool, race as two hosts of a fleet would.
func TestPostgresUsage(t *testing.T) {
	nstest.RunUsage(t, func(t *testing.T, n int) []namespaces.Registry {
		dsn := pgtest.DSN(t)
		regs := make([]namespaces.Registry, n)
		for i := range regs {
			regs[i], _ = openPostgres(t, dsn, nil)
		}
		return regs
	}, damage)
}
