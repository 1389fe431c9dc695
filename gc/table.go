package gc

import (
	"context"
	"database/sql"
	"iter"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Table is a liveness source that an embedder keeps in the pool's shared
// database: every row of the table names a live digest in its digest
// column (32 bytes, BYTEA or BLOB). It is how a fleet's own bookkeeping
// protects blobs on every host at once. Its rows are read by package
// meta (meta.LiveTable); what they mean is the collector's.
//
// Design point (fleet liveness verb): the same Register as any Source,
// with a table-shaped argument built by NewTable, whose errors (a malformed
// name, a missing table or column) come at registration. The collector
// reads the table and never creates, alters or writes it.
//
// Design point (tables in the mark): never enumerated — Live yields
// nothing. A blob only a table keeps alive is queued by a sweep and
// cancelled when its candidate is arbitrated, inside the arbitration
// transaction, where the table is read (Shared).
//
// Design point (in-process sources in a fleet): allowed, and protective
// only in their own process; a fleet-wide reference must be a row (a pin
// or a Table) before another host sweeps. The protect callback likewise
// protects against its own process's sweeps only.
type Table struct {
	live *meta.LiveTable
}

var _ SharedSource = (*Table)(nil)

// NewTable checks that name ("table" or "schema.table", each part taken
// literally, case and all) is a readable table with a digest column in db,
// and returns it as a source. dialect is "sqlite" or "postgres".
func NewTable(ctx context.Context, db *sql.DB, dialect, name string) (*Table, error) {
	live, err := meta.NewLiveTable(ctx, db, dialect, name)
	if err != nil {
		return nil, err
	}
	return &Table{live: live}, nil
}

// ErrTableName: a liveness table name that does not parse.
var ErrTableName = meta.ErrTableName

// Name is the quoted table reference.
func (t *Table) Name() string { return t.live.Name() }

// IsLive implements Source.
func (t *Table) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	live, err := t.live.LiveAmong(ctx, []blob.Digest{d})
	return live[d], err
}

// Live implements Source: nothing (see the design point on Table).
func (t *Table) Live(context.Context) iter.Seq2[blob.Digest, error] {
	return func(func(blob.Digest, error) bool) {}
}

// Shared implements SharedSource: the table, which arbitration reads in
// its transaction.
func (t *Table) Shared() meta.Liveness { return t.live }
