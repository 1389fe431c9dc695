package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Window is the GC's durable delete window in a gc_window table:
//
//	gc_window(digest BYTEA PRIMARY KEY, visible_after BIGINT NOT NULL)
//
// visible_after is unix nanoseconds on the server's clock (engines.PGNow):
// a row queued by one host is due at the same moment for every host,
// whatever their own clocks say. Both PostgreSQL engines embed it (the
// table is shared when they share a database); the store uses one window
// host per instance, so with kv=postgres the pglo engine's stays dormant.
type Window struct {
	pool *pgxpool.Pool
	name string // engine name, for errors
}

var _ engines.WindowHost = (*Window)(nil)

const windowSchema = `CREATE TABLE IF NOT EXISTS gc_window (
	digest        BYTEA PRIMARY KEY,
	visible_after BIGINT NOT NULL
)`

// NewWindow creates gc_window in pool's database if needed. name is the
// engine name errors carry.
func NewWindow(ctx context.Context, pool *pgxpool.Pool, name string) (*Window, error) {
	if err := CreateSchema(ctx, pool, windowSchema); err != nil {
		return nil, blob.Wrap("open", name, blob.Digest{}, err)
	}
	return &Window{pool: pool, name: name}, nil
}

// CreateSchema runs ddl in one transaction under an advisory lock, so that
// engines opening the same database at once do not trip over each other,
// unless every table and index it makes exists already: then it runs
// nothing, and takes no lock that a writer of those tables holds (see
// engines.DDLRelations).
func CreateSchema(ctx context.Context, pool *pgxpool.Pool, ddl ...string) error {
	if names, ok := engines.DDLRelations(ddl); ok {
		var missing int
		if err := pool.QueryRow(ctx, engines.PGMissingRelations, names).Scan(&missing); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		if missing == 0 {
			return nil
		}
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, engines.PGSchemaLock); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		for _, s := range ddl {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("create schema: %w", err)
			}
		}
		return nil
	})
}

// WindowQueue implements engines.WindowHost in one statement. A digest
// already queued keeps its row (and its time).
func (w *Window) WindowQueue(ctx context.Context, ds []blob.Digest, delay time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	_, err := w.pool.Exec(ctx, `INSERT INTO gc_window (digest, visible_after)
		SELECT d, `+nowOnce+` + $2::bigint FROM unnest($1::bytea[]) AS d ON CONFLICT (digest) DO NOTHING`,
		byteas(ds), int64(max(delay, 0)))
	return w.wrap("window queue", err)
}

// WindowDue implements engines.WindowHost.
func (w *Window) WindowDue(ctx context.Context, after blob.Digest, limit int) ([]blob.Digest, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := w.pool.Query(ctx, `SELECT digest FROM gc_window
		WHERE digest > $1 AND visible_after <= `+nowOnce+` ORDER BY digest LIMIT $2`, Key(after), limit)
	if err != nil {
		return nil, w.wrap("window due", err)
	}
	defer rows.Close()
	var ds []blob.Digest
	if err := engines.ScanDigests(rows, func(d blob.Digest) { ds = append(ds, d) }); err != nil {
		return nil, w.wrap("window due", err)
	}
	return ds, nil
}

// WindowRemove implements engines.WindowHost; absent digests are ignored.
func (w *Window) WindowRemove(ctx context.Context, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	_, err := w.pool.Exec(ctx, `DELETE FROM gc_window WHERE digest = ANY($1::bytea[])`, byteas(ds))
	return w.wrap("window remove", err)
}

// WindowLen implements engines.WindowHost.
func (w *Window) WindowLen(ctx context.Context) (int, error) {
	var n int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM gc_window`).Scan(&n); err != nil {
		return 0, w.wrap("window len", err)
	}
	return n, nil
}

func (w *Window) wrap(op string, err error) error {
	return blob.Wrap(op, w.name, blob.Digest{}, err)
}

// Key is a listing cursor as a bind argument of "digest > $n": the zero
// digest binds as the empty bytea, which sorts below every 32-byte key, so
// the zero cursor lists from the start, the zero digest included.
func Key(d blob.Digest) []byte {
	if d.IsZero() {
		return []byte{}
	}
	return d[:]
}
