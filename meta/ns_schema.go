package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/alkblobfs/alkblobfs/engines"
)

// The namespaces' tables: names, their links (references) and intents,
// and the usage counters kept from them (package namespaces says what
// they mean; this file owns their schema and migrations):
//
//	ns(name PRIMARY KEY, created_at, uid, gid, mode, blobs, bytes, quota_blobs, quota_bytes)
//	ns_refs(ns REFERENCES ns, digest, linked_at, size)       PRIMARY KEY (ns, digest); index ns_refs_digest (digest)
//	ns_pending(id PRIMARY KEY, ns REFERENCES ns, digest, holder, expiry, size)
//	                                                          index ns_pending_digest (digest); on PostgreSQL ns_pending_holder (holder)
//
// The names and columns are those package namespaces created before this
// package owned them, so a database made by an earlier build opens with
// its rows; the migrations it ran (permission columns, usage columns, the
// SQLite holder index dropped) still run here.

// nsDDL is the namespaces' schema per dialect.
var nsDDL = map[string][]string{
	"sqlite": {
		`CREATE TABLE IF NOT EXISTS ns (
			name       TEXT PRIMARY KEY,
			created_at INTEGER NOT NULL,
			uid        INTEGER,
			gid        INTEGER,
			mode       INTEGER,
			blobs       INTEGER NOT NULL DEFAULT 0,
			bytes       INTEGER NOT NULL DEFAULT 0,
			quota_blobs INTEGER NOT NULL DEFAULT 0,
			quota_bytes INTEGER NOT NULL DEFAULT 0
		) WITHOUT ROWID`,
		// WITHOUT ROWID clusters the rows by (ns, digest): a namespace's
		// listing reads consecutive pages.
		`CREATE TABLE IF NOT EXISTS ns_refs (
			ns        TEXT NOT NULL REFERENCES ns (name),
			digest    BLOB NOT NULL,
			linked_at INTEGER NOT NULL,
			size      INTEGER,
			PRIMARY KEY (ns, digest)
		) WITHOUT ROWID`,
		`CREATE INDEX IF NOT EXISTS ns_refs_digest ON ns_refs (digest)`,
		nsUnsizedIndex,
		`CREATE TABLE IF NOT EXISTS ns_pending (
			id     INTEGER PRIMARY KEY,
			ns     TEXT NOT NULL REFERENCES ns (name),
			digest BLOB NOT NULL,
			holder TEXT NOT NULL,
			expiry INTEGER NOT NULL,
			size   INTEGER
		)`,
		`CREATE INDEX IF NOT EXISTS ns_pending_digest ON ns_pending (digest)`,
		// No index on holder: it cost every small close a b-tree write,
		// and ns_pending holds only the intents of files being written,
		// which Renew and Recover scan (docs/gc.md, "What a small close
		// writes"). dropPendingHolder drops it from older databases.
	},
	"postgres": {
		// COLLATE "C": names list in byte order whatever the database's
		// locale. BIGINT: INTEGER is 32-bit in PostgreSQL.
		`CREATE TABLE IF NOT EXISTS ns (
			name       TEXT COLLATE "C" PRIMARY KEY,
			created_at BIGINT NOT NULL,
			uid        BIGINT,
			gid        BIGINT,
			mode       BIGINT,
			blobs       BIGINT NOT NULL DEFAULT 0,
			bytes       BIGINT NOT NULL DEFAULT 0,
			quota_blobs BIGINT NOT NULL DEFAULT 0,
			quota_bytes BIGINT NOT NULL DEFAULT 0
		)`,
		// The foreign key closes the Link/Remove race under READ COMMITTED
		// (SQLite serializes writers, so it needs no enforcement there).
		`CREATE TABLE IF NOT EXISTS ns_refs (
			ns        TEXT COLLATE "C" NOT NULL REFERENCES ns (name),
			digest    BYTEA NOT NULL,
			linked_at BIGINT NOT NULL,
			size      BIGINT,
			PRIMARY KEY (ns, digest)
		)`,
		`CREATE INDEX IF NOT EXISTS ns_refs_digest ON ns_refs (digest)`,
		nsUnsizedIndex,
		`CREATE TABLE IF NOT EXISTS ns_pending (
			id     BIGINT PRIMARY KEY,
			ns     TEXT COLLATE "C" NOT NULL REFERENCES ns (name),
			digest BYTEA NOT NULL,
			holder TEXT NOT NULL,
			expiry BIGINT NOT NULL,
			size   BIGINT
		)`,
		`CREATE INDEX IF NOT EXISTS ns_pending_digest ON ns_pending (digest)`,
		`CREATE INDEX IF NOT EXISTS ns_pending_holder ON ns_pending (holder)`,
	},
}

// nsUnsizedIndex finds the references made before sizes were kept, which
// namespaces.Service.FillSizes sizes from the pool: empty once they are,
// so it costs the writes of sized references nothing, and an open finds
// at once that there is nothing to fill.
const nsUnsizedIndex = `CREATE INDEX IF NOT EXISTS ns_refs_unsized ON ns_refs (digest) WHERE size IS NULL`

// NSSchema is what OpenNSTables found of the namespaces' tables in a
// database made by an older build that cannot be written (read-only
// media), and what it changed in one that can.
type NSSchema struct {
	// Perm: ns has the permission columns (uid, gid, mode).
	Perm bool
	// Usage: the tables have the usage columns (ns counters and quotas,
	// the rows' sizes).
	Usage bool
	// UsageAdded: this open added the usage columns, so the counters of
	// the rows made before must be counted once (namespaces' Recount).
	UsageAdded bool
}

// OpenNSTables creates the namespaces' tables in db if needed and brings
// tables of an older build up to date; dialect is "sqlite" or
// "postgres". On read-only media it changes nothing and reports what the
// tables lack.
func OpenNSTables(ctx context.Context, db *sql.DB, dialect string) (NSSchema, error) {
	stmts, ok := nsDDL[dialect]
	if !ok {
		return NSSchema{}, fmt.Errorf("unknown SQL dialect %q (want sqlite or postgres)", dialect)
	}
	var s NSSchema
	// The usage columns go in first: the schema's index of unsized
	// references names one of them.
	err := retryDeadlock(func() (err error) {
		s.UsageAdded, s.Usage, err = addUsageColumns(ctx, db, dialect)
		return err
	})
	if err != nil {
		return NSSchema{}, fmt.Errorf("add the usage columns: %w", err)
	}
	if !s.Usage {
		// An older store on read-only media: no index on a column it
		// lacks.
		stmts = slices.DeleteFunc(slices.Clone(stmts), func(q string) bool { return q == nsUnsizedIndex })
	}
	if err := createNSSchema(ctx, db, dialect, stmts); err != nil {
		return NSSchema{}, fmt.Errorf("create schema: %w", err)
	}
	if dialect == "sqlite" {
		if err := dropPendingHolder(ctx, db); err != nil {
			return NSSchema{}, fmt.Errorf("drop the index ns_pending_holder: %w", err)
		}
	}
	err = retryDeadlock(func() (err error) {
		s.Perm, err = addPermColumns(ctx, db, dialect)
		return err
	})
	if err != nil {
		return NSSchema{}, fmt.Errorf("add the ns permission columns: %w", err)
	}
	return s, nil
}

// retryDeadlock runs f again, up to three times in all, while PostgreSQL
// answers "deadlock detected": concurrent opens of an old store (one
// adding the permission columns, another preparing statements on the
// table) can form a lock cycle, which the server breaks by aborting one
// of them; that one just tries again.
func retryDeadlock(f func() error) error {
	for try := 1; ; try++ {
		err := f()
		var st interface{ SQLState() string }
		if err == nil || try == 3 || !errors.As(err, &st) || st.SQLState() != "40P01" {
			return err
		}
	}
}

// createNSSchema creates the tables and indexes that do not exist yet. On
// SQLite each statement runs on its own, taking the write lock only if it
// creates something (a store on read-only media opens too); on PostgreSQL
// all of them run in one transaction under the schema lock, so that hosts
// opening one database at once do not trip over each other's CREATE TABLE.
func createNSSchema(ctx context.Context, db *sql.DB, dialect string, stmts []string) error {
	if dialect != "postgres" {
		for _, s := range stmts {
			if _, err := db.ExecContext(ctx, s); err != nil {
				// An index serves speed only: a database on read-only
				// media that lacks one (ns_pending_digest, which a build
				// of this week dropped) opens and scans instead.
				if readOnlyDB(err) && strings.HasPrefix(s, "CREATE INDEX") {
					continue
				}
				return err
			}
		}
		return nil
	}
	// A schema that exists is left alone (see engines.DDLRelations: the
	// DDL's locks deadlock with a busy mount's writes).
	if names, ok := engines.DDLRelations(stmts); ok {
		var missing int
		if err := db.QueryRowContext(ctx, engines.PGMissingRelations, names).Scan(&missing); err != nil {
			return err
		}
		if missing == 0 {
			return nil
		}
	}
	return InTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, engines.PGSchemaLock); err != nil {
			return err
		}
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
}

// addPermColumns adds ns.uid, gid and mode to a table made before they
// existed, and reports whether the table has them. It looks first without
// a transaction; only a table that lacks them is altered, in a
// transaction (IMMEDIATE on SQLite, under the schema lock on PostgreSQL)
// that looks again, so that concurrent opens add them once. A database
// that cannot be written (read-only media) keeps its table as it is: ok
// is false.
func addPermColumns(ctx context.Context, db *sql.DB, dialect string) (ok bool, err error) {
	q := `SELECT COUNT(*) FROM pragma_table_info('ns') WHERE name IN ('uid', 'gid', 'mode')`
	typ := "INTEGER"
	if dialect == "postgres" {
		q = `SELECT COUNT(*) FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = 'ns' AND column_name IN ('uid', 'gid', 'mode')`
		typ = "BIGINT"
	}
	var n int
	if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil || n == 3 {
		return err == nil, err
	}
	err = InTx(ctx, db, nil, func(tx *sql.Tx) error {
		if dialect == "postgres" {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, engines.PGSchemaLock); err != nil {
				return err
			}
		}
		if err := tx.QueryRowContext(ctx, q).Scan(&n); err != nil || n == 3 {
			return err
		}
		for _, col := range []string{"uid", "gid", "mode"} {
			if _, err := tx.ExecContext(ctx, "ALTER TABLE ns ADD COLUMN "+col+" "+typ); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && readOnlyDB(err) {
		return false, nil
	}
	return err == nil, err
}

// readOnlyDB reports whether err says the database cannot be written
// (SQLite's SQLITE_READONLY, PostgreSQL's read-only transaction).
func readOnlyDB(err error) bool {
	s := err.Error()
	return strings.Contains(s, "readonly database") || strings.Contains(s, "read-only transaction")
}

// dropPendingHolder drops the SQLite index ns_pending_holder that older
// builds made (see nsDDL). It looks first, without the write lock, so
// that an open of a database without it writes nothing; DROP INDEX IF
// EXISTS is one statement, so processes opening at once drop it once and
// the others find nothing to do. An older build that opens the database
// again creates it again, which costs only its writes until the next open
// here. A database that cannot be written (read-only media) keeps it.
func dropPendingHolder(ctx context.Context, db *sql.DB) error {
	var n int
	q := `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'ns_pending_holder'`
	if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil || n == 0 {
		return err
	}
	if _, err := db.ExecContext(ctx, `DROP INDEX IF EXISTS ns_pending_holder`); err != nil && !readOnlyDB(err) {
		return err
	}
	return nil
}

// usageColumns are the columns usage added to tables made before it.
var usageColumns = []struct{ table, column, def string }{
	{"ns", "blobs", "NOT NULL DEFAULT 0"},
	{"ns", "bytes", "NOT NULL DEFAULT 0"},
	{"ns", "quota_blobs", "NOT NULL DEFAULT 0"},
	{"ns", "quota_bytes", "NOT NULL DEFAULT 0"},
	{"ns_refs", "size", ""},
	{"ns_pending", "size", ""},
}

// columnQuerier is what *sql.DB and *sql.Tx share that addUsageColumns
// reads the columns with.
type columnQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// addUsageColumns adds the usage columns to tables made before they
// existed, as addPermColumns does the permission columns: it looks first
// without a transaction, and alters only tables that lack them, in a
// transaction that looks again. added reports whether this call added
// them (the caller then recounts); ok is false on a database that lacks
// them and cannot be written.
func addUsageColumns(ctx context.Context, db *sql.DB, dialect string) (added, ok bool, err error) {
	q := `SELECT name FROM pragma_table_info(?)`
	typ := "INTEGER"
	if dialect == "postgres" {
		q = `SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1`
		typ = "BIGINT"
	}
	// A table that does not exist yet (a new store) is created with
	// them: only a table with columns but not these lacks them.
	missing := func(qr columnQuerier) ([]int, error) {
		have := make(map[string]map[string]bool)
		var out []int
		for i, c := range usageColumns {
			if have[c.table] == nil {
				have[c.table] = make(map[string]bool)
				rows, err := qr.QueryContext(ctx, q, c.table)
				if err != nil {
					return nil, err
				}
				for rows.Next() {
					var n string
					if err := rows.Scan(&n); err != nil {
						rows.Close()
						return nil, err
					}
					have[c.table][n] = true
				}
				if err := errors.Join(rows.Err(), rows.Close()); err != nil {
					return nil, err
				}
			}
			if len(have[c.table]) > 0 && !have[c.table][c.column] {
				out = append(out, i)
			}
		}
		return out, nil
	}
	need, err := missing(db)
	if err != nil || len(need) == 0 {
		return false, err == nil, err
	}
	err = InTx(ctx, db, nil, func(tx *sql.Tx) error {
		added = false
		if dialect == "postgres" {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, engines.PGSchemaLock); err != nil {
				return err
			}
		}
		need, err := missing(tx)
		if err != nil {
			return err
		}
		for _, i := range need {
			c := usageColumns[i]
			if _, err := tx.ExecContext(ctx, "ALTER TABLE "+c.table+" ADD COLUMN "+c.column+" "+typ+" "+c.def); err != nil {
				return err
			}
		}
		added = len(need) > 0
		return nil
	})
	if err != nil && readOnlyDB(err) {
		return false, false, nil
	}
	return added, err == nil, err
}
