package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// LiveTable is a table that an embedder keeps in the pool's shared
// database, whose every row names a live digest in its digest column (32
// bytes, BYTEA or BLOB): gc.Table's rows. This package only reads it,
// and never creates, alters or writes it; what its rows mean is the
// collector's.
type LiveTable struct {
	db      *sql.DB
	dialect string
	ref     string // quoted
}

// NewLiveTable checks that name ("table" or "schema.table", each part
// taken literally, case and all) is a readable table with a digest
// column in db, and returns it. dialect is "sqlite" or "postgres". A name
// that does not parse is an error wrapping ErrTableName.
func NewLiveTable(ctx context.Context, db *sql.DB, dialect, name string) (*LiveTable, error) {
	ref, err := quoteRef(name)
	if err != nil {
		return nil, err
	}
	if dialect != "sqlite" && dialect != "postgres" {
		return nil, fmt.Errorf("liveness table %q: unknown SQL dialect %q", name, dialect)
	}
	rows, err := db.QueryContext(ctx, "SELECT digest FROM "+ref+" WHERE 1 = 0")
	if err != nil {
		return nil, fmt.Errorf("liveness table %s: %w (it must exist, with a digest column of 32-byte keys)", ref, err)
	}
	rows.Close()
	return &LiveTable{db: db, dialect: dialect, ref: ref}, nil
}

// ErrTableName: a liveness table name that does not parse.
var ErrTableName = errors.New("bad liveness table name")

// quoteRef quotes a [schema.]table reference part by part, so that no name
// is ever interpolated unquoted.
func quoteRef(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w %q: want TABLE or SCHEMA.TABLE", ErrTableName, name)
	}
	for i, p := range parts {
		if p == "" || strings.ContainsRune(p, 0) || len(p) > 63 {
			return "", fmt.Errorf("%w %q: each part must be 1-63 bytes without NUL", ErrTableName, name)
		}
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, "."), nil
}

// Name is the quoted table reference.
func (t *LiveTable) Name() string { return t.ref }

// LiveAmong returns the digests of ds that a row names, read outside any
// arbitration (a direct delete's in-process checks, tools).
func (t *LiveTable) LiveAmong(ctx context.Context, ds []blob.Digest) (map[blob.Digest]bool, error) {
	return t.liveAmong(ctx, t.db, ds)
}

// liveAmongTx implements Liveness: the same query in an arbitration's
// transaction.
func (t *LiveTable) liveAmongTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error) {
	return t.liveAmong(ctx, tx, ds)
}

func (t *LiveTable) liveAmong(ctx context.Context, q0 engines.Querier, ds []blob.Digest) (map[blob.Digest]bool, error) {
	live := make(map[blob.Digest]bool)
	if len(ds) == 0 {
		return live, nil
	}
	args := make([]any, len(ds))
	for i, d := range ds {
		args[i] = d[:]
	}
	q := engines.Rebind(t.dialect, "SELECT DISTINCT digest FROM "+t.ref+" WHERE digest IN (?"+strings.Repeat(", ?", len(ds)-1)+")")
	rows, err := q0.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("liveness table %s: %w", t.ref, err)
	}
	defer rows.Close()
	if err := engines.ScanDigests(rows, func(d blob.Digest) { live[d] = true }); err != nil {
		if errors.Is(err, blob.ErrCorruptRow) {
			// A row that names no digest keeps nothing alive, but says the
			// table is not what the operator thinks: fail loudly.
			err = errors.Join(err, errors.New("the digest column must hold 32-byte sha256 keys"))
		}
		return nil, fmt.Errorf("liveness table %s: %w", t.ref, err)
	}
	return live, nil
}
