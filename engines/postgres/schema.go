package postgres

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
)

// CreateSchema runs ddl as meta.CreatePGSchema does: in one transaction
// under the schema lock, unless every table and index it makes exists.
func CreateSchema(ctx context.Context, pool *pgxpool.Pool, ddl ...string) error {
	return meta.CreatePGSchema(ctx, pool, ddl...)
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
