package gc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Table is a liveness source that an embedder keeps in the pool's shared
// database: every row of the table names a live digest in its digest
// column (32 bytes, BYTEA or BLOB). It is how a fleet's own bookkeeping
// protects blobs on every host at once.
//
// Design point (fleet liveness verb): the same Register as any Source,
// with a table-shaped argument built by NewTable, whose errors (a malformed
// name, a missing table or column) come at registration. The collector
// reads the table and never creates, alters or writes it.
//
// Design point (tables in the mark): never enumerated — Live yields
// nothing. A blob only a table keeps alive is queued by a sweep and
// cancelled when its candidate is arbitrated, inside the arbitration
// transaction, where the table is read (LiveAmongTx).
//
// Design point (in-process sources in a fleet): allowed, and protective
// only in their own process; a fleet-wide reference must be a row (a pin
// or a Table) before another host sweeps. The protect callback likewise
// protects against its own process's sweeps only.
type Table struct {
	db      *sql.DB
	dialect string
	ref     string // quoted
}

var _ TxSource = (*Table)(nil)

// NewTable checks that name ("table" or "schema.table", each part taken
// literally, case and all) is a readable table with a digest column in db,
// and returns it as a source. dialect is "sqlite" or "postgres".
func NewTable(ctx context.Context, db *sql.DB, dialect, name string) (*Table, error) {
	ref, err := quoteRef(name)
	if err != nil {
		return nil, err
	}
	if dialect != "sqlite" && dialect != "postgres" {
		return nil, fmt.Errorf("liveness table %q: unknown SQL dialect %q", name, dialect)
	}
	t := &Table{db: db, dialect: dialect, ref: ref}
	rows, err := db.QueryContext(ctx, "SELECT digest FROM "+ref+" WHERE 1 = 0")
	if err != nil {
		return nil, fmt.Errorf("liveness table %s: %w (it must exist, with a digest column of 32-byte keys)", ref, err)
	}
	rows.Close()
	return t, nil
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
func (t *Table) Name() string { return t.ref }

// IsLive implements Source.
func (t *Table) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	live, err := t.liveAmong(ctx, t.db, []blob.Digest{d})
	return live[d], err
}

// Live implements Source: nothing (see the design point on Table).
func (t *Table) Live(context.Context) iter.Seq2[blob.Digest, error] {
	return func(func(blob.Digest, error) bool) {}
}

// LiveAmongTx implements TxSource.
func (t *Table) LiveAmongTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error) {
	return t.liveAmong(ctx, tx, ds)
}

func (t *Table) liveAmong(ctx context.Context, q0 engines.Querier, ds []blob.Digest) (map[blob.Digest]bool, error) {
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
