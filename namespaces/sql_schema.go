package namespaces

import (
	"context"
	"database/sql"
	"strings"

	"github.com/alkblobfs/alkblobfs/engines"
)

// createSchema creates the tables and indexes that do not exist yet. On
// SQLite each statement runs on its own, taking the write lock only if it
// creates something (a store on read-only media opens too); on PostgreSQL
// all of them run in one transaction under the schema lock, so that hosts
// opening one database at once do not trip over each other's CREATE TABLE.
func createSchema(ctx context.Context, db *sql.DB, dialect string, stmts []string) error {
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
	return engines.InTx(ctx, db, nil, func(tx *sql.Tx) error {
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
	err = engines.InTx(ctx, db, nil, func(tx *sql.Tx) error {
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
// builds made (see ddl). It looks first, without the write lock, so that
// an open of a database without it writes nothing; DROP INDEX IF EXISTS
// is one statement, so processes opening at once drop it once and the
// others find nothing to do. An older build that opens the database again
// creates it again, which costs only its writes until the next open here.
// A database that cannot be written (read-only media) keeps it.
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
