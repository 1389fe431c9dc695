package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

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

// Key is a listing cursor as a bind argument of "digest > $n": the zero
// digest binds as the empty bytea, which sorts below every 32-byte key, so
// the zero cursor lists from the start, the zero digest included.
func Key(d blob.Digest) []byte {
	if d.IsZero() {
		return []byte{}
	}
	return d[:]
}
