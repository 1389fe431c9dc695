package namespaces

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
)

// SQL is a Registry kept in two tables of a database/sql database, normally
// the kv engine's own (see Open), so that links survive restarts and can
// commit in the same transaction as a put (LinkTx):
//
//	ns(name TEXT PRIMARY KEY, created_at INTEGER, uid, gid, mode INTEGER NULL)
//	ns_refs(ns TEXT REFERENCES ns, digest BLOB, linked_at INTEGER, PRIMARY KEY (ns, digest))
//	index ns_refs_digest on ns_refs(digest), for IsLive and Live
//	ns_pending(id INTEGER PRIMARY KEY, ns TEXT REFERENCES ns, digest BLOB, holder TEXT, expiry INTEGER)
//	indexes ns_pending(digest) for liveness, ns_pending(holder) for Renew
//
// Times are unix nanoseconds. linked_at and created_at are the registry's
// Clock (wall time). An intent's expiry is the row clock's, which every
// process sharing the database reads alike: the server's on PostgreSQL
// (engines.PGNow, read in the statement), the engine's on SQLite
// (engines.RowClock, bound); writers pass a TTL. The DDL is per dialect
// (BLOB/BYTEA, BIGINT, byte-order collation on PostgreSQL); every DML
// statement is shared, with `?` placeholders rebound to `$n` for
// PostgreSQL and {now} standing for the row clock (see args).
//
// On SQLite the pool must begin transactions IMMEDIATE (_txlock=immediate,
// as engines/sqlite does): Link reads and then writes in one transaction.
type SQL struct {
	db      *sql.DB
	dialect string
	clock   Clock
	// rows is the row clock on SQLite; nil on PostgreSQL, whose
	// statements read the server's.
	rows engines.RowClock
	q    queries
	// The statements of a put's joint link, prepared once: parsing them
	// per put was a tenth of the CPU of a `cp -r` of small files.
	existsStmt, linkStmt, pendStmt, unpendStmt *sql.Stmt
	settleTakeStmt, settleLinkStmt             *sql.Stmt
	// batch, when the engine has one (SQLite), carries the registry's
	// write transactions (write), settles lazily.
	batch *engines.Batcher
	// settles groups concurrent settles in one statement (PostgreSQL).
	settles *settleGroup
	// noPerm: the ns table has no permission columns (an older store on
	// read-only media): Perm reports none.
	noPerm bool
	// listen and origin serve Watch on PostgreSQL (watch_postgres.go).
	listen listener
	origin string
}

var (
	_ Registry       = (*SQL)(nil)
	_ gc.BatchSource = (*SQL)(nil)
	_ gc.TxSource    = (*SQL)(nil)
	_ TxLinker       = (*SQL)(nil)
)

var ddl = map[string][]string{
	"sqlite": {
		`CREATE TABLE IF NOT EXISTS ns (
			name       TEXT PRIMARY KEY,
			created_at INTEGER NOT NULL,
			uid        INTEGER,
			gid        INTEGER,
			mode       INTEGER
		) WITHOUT ROWID`,
		// WITHOUT ROWID clusters the rows by (ns, digest): a namespace's
		// listing reads consecutive pages.
		`CREATE TABLE IF NOT EXISTS ns_refs (
			ns        TEXT NOT NULL REFERENCES ns (name),
			digest    BLOB NOT NULL,
			linked_at INTEGER NOT NULL,
			PRIMARY KEY (ns, digest)
		) WITHOUT ROWID`,
		`CREATE INDEX IF NOT EXISTS ns_refs_digest ON ns_refs (digest)`,
		`CREATE TABLE IF NOT EXISTS ns_pending (
			id     INTEGER PRIMARY KEY,
			ns     TEXT NOT NULL REFERENCES ns (name),
			digest BLOB NOT NULL,
			holder TEXT NOT NULL,
			expiry INTEGER NOT NULL
		)`,
		`CREATE INDEX IF NOT EXISTS ns_pending_digest ON ns_pending (digest)`,
		`CREATE INDEX IF NOT EXISTS ns_pending_holder ON ns_pending (holder)`,
	},
	"postgres": {
		// COLLATE "C": names list in byte order whatever the database's
		// locale. BIGINT: INTEGER is 32-bit in PostgreSQL.
		`CREATE TABLE IF NOT EXISTS ns (
			name       TEXT COLLATE "C" PRIMARY KEY,
			created_at BIGINT NOT NULL,
			uid        BIGINT,
			gid        BIGINT,
			mode       BIGINT
		)`,
		// The foreign key closes the Link/Remove race under READ COMMITTED
		// (SQLite serializes writers, so it needs no enforcement there).
		`CREATE TABLE IF NOT EXISTS ns_refs (
			ns        TEXT COLLATE "C" NOT NULL REFERENCES ns (name),
			digest    BYTEA NOT NULL,
			linked_at BIGINT NOT NULL,
			PRIMARY KEY (ns, digest)
		)`,
		`CREATE INDEX IF NOT EXISTS ns_refs_digest ON ns_refs (digest)`,
		`CREATE TABLE IF NOT EXISTS ns_pending (
			id     BIGINT PRIMARY KEY,
			ns     TEXT COLLATE "C" NOT NULL REFERENCES ns (name),
			digest BYTEA NOT NULL,
			holder TEXT NOT NULL,
			expiry BIGINT NOT NULL
		)`,
		`CREATE INDEX IF NOT EXISTS ns_pending_digest ON ns_pending (digest)`,
		`CREATE INDEX IF NOT EXISTS ns_pending_holder ON ns_pending (holder)`,
	},
}

type queries struct {
	create, remove, exists, names        string
	perm, setPerm                        string
	linkIf, unlink, has, count, entries  string
	pend, unpend, settleTake, settleLink string
	renew, recoverTake, recoverLink      string
	isLive, live                         string
	linkRows                             string // linkBatch rows per INSERT
}

// linkBatch is how many rows one LinkMany INSERT carries: 768 bind
// parameters, far under SQLite's 32 766 and PostgreSQL's 65 535, and
// enough to amortize per-statement cost.
const linkBatch = 256

func newQueries(dialect string) queries {
	now := "?"
	if dialect == "postgres" {
		now = "(SELECT " + engines.PGNow + ")"
	}
	r := func(q string) string { return rebind(dialect, strings.ReplaceAll(q, "{now}", now)) }
	q := queries{
		create:  r(`INSERT INTO ns (name, created_at, uid, gid, mode) VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`),
		perm:    r(`SELECT uid, gid, mode FROM ns WHERE name = ?`),
		setPerm: r(`UPDATE ns SET uid = ?, gid = ?, mode = ? WHERE name = ?`),
		remove: r(`DELETE FROM ns WHERE name = ? AND NOT EXISTS (SELECT 1 FROM ns_refs WHERE ns = ?)
			AND NOT EXISTS (SELECT 1 FROM ns_pending WHERE ns = ?)`),
		exists: r(`SELECT 1 FROM ns WHERE name = ?`),
		names:  r(`SELECT name FROM ns WHERE name > ? ORDER BY name LIMIT ?`),

		linkIf:  r(`INSERT INTO ns_refs (ns, digest, linked_at) SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM ns WHERE name = ?) ON CONFLICT (ns, digest) DO NOTHING`),
		unlink:  r(`DELETE FROM ns_refs WHERE ns = ? AND digest = ?`),
		has:     r(`SELECT linked_at FROM ns_refs WHERE ns = ? AND digest = ?`),
		count:   r(`SELECT COUNT(*) FROM ns_refs WHERE ns = ?`),
		entries: r(`SELECT digest, linked_at FROM ns_refs WHERE ns = ? AND digest > ? ORDER BY digest LIMIT ?`),

		pend:   r(`INSERT INTO ns_pending (id, ns, digest, holder, expiry) SELECT ?, ?, ?, ?, {now} + ? WHERE EXISTS (SELECT 1 FROM ns WHERE name = ?)`),
		unpend: r(`DELETE FROM ns_pending WHERE id = ?`),
		renew:  r(`UPDATE ns_pending SET expiry = {now} + ? WHERE holder = ?`),
		// Settle and Recover on SQLite: take the rows, then link them, in
		// one IMMEDIATE transaction.
		settleTake:  r(`DELETE FROM ns_pending WHERE id = ? RETURNING ns, digest`),
		settleLink:  r(`INSERT INTO ns_refs (ns, digest, linked_at) VALUES (?, ?, ?) ON CONFLICT (ns, digest) DO NOTHING`),
		recoverLink: r(`INSERT INTO ns_refs (ns, digest, linked_at) SELECT DISTINCT ns, digest, ? FROM ns_pending WHERE holder = ? OR expiry < {now} ON CONFLICT (ns, digest) DO NOTHING`),
		recoverTake: r(`DELETE FROM ns_pending WHERE holder = ? OR expiry < {now}`),

		// A digest is live while a namespace references it or an intent
		// means to.
		isLive: r(`SELECT 1 FROM ns_refs WHERE digest = ? UNION ALL SELECT 1 FROM ns_pending WHERE digest = ? LIMIT 1`),
		live:   r(`SELECT digest FROM ns_refs WHERE digest > ? UNION SELECT digest FROM ns_pending WHERE digest > ? ORDER BY 1 LIMIT ?`),
	}
	if dialect == "postgres" {
		// PostgreSQL sorts a whole UNION before its LIMIT: limit each
		// index range first (DISTINCT per branch, or one digest linked
		// in many namespaces would fill the page).
		q.live = `(SELECT DISTINCT digest FROM ns_refs WHERE digest > $1 ORDER BY digest LIMIT $3)
			UNION (SELECT DISTINCT digest FROM ns_pending WHERE digest > $2 ORDER BY digest LIMIT $3)
			ORDER BY 1 LIMIT $3`
		// One statement each: READ COMMITTED gives no snapshot across two.
		q.settleTake = `WITH p AS (DELETE FROM ns_pending WHERE id = $1 RETURNING ns, digest),
			l AS (INSERT INTO ns_refs (ns, digest, linked_at) SELECT ns, digest, $2::bigint FROM p ON CONFLICT (ns, digest) DO NOTHING RETURNING 1)
			SELECT count(*) FROM l`
		q.recoverTake = `WITH p AS (DELETE FROM ns_pending WHERE holder = $1 OR expiry < ` + now + ` RETURNING ns, digest),
			l AS (INSERT INTO ns_refs (ns, digest, linked_at) SELECT DISTINCT ns, digest, $2::bigint FROM p ON CONFLICT (ns, digest) DO NOTHING)
			SELECT count(*) FROM p`
	}
	q.linkRows = linkRowsQuery(dialect, linkBatch)
	return q
}

func linkRowsQuery(dialect string, rows int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ns_refs (ns, digest, linked_at) VALUES `)
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?)")
	}
	b.WriteString(` ON CONFLICT (ns, digest) DO NOTHING`)
	return rebind(dialect, b.String())
}

// rebind is engines.Rebind: the statements here are written once with `?`.
func rebind(dialect, q string) string { return engines.Rebind(dialect, q) }

// OpenSQL creates the registry's tables in e's database if needed and
// returns the registry. e's dialect is "sqlite" or "postgres"; a SQLite
// engine must be an engines.RowClock (engines/sqlite is), which times the
// intents. clock stamps LinkedAt; nil means the wall clock. The registry
// does not own e's database: closing the engine closes it.
func OpenSQL(ctx context.Context, e engines.SQL, clock Clock) (*SQL, error) {
	db, dialect := e.DB(), e.Dialect()
	stmts, ok := ddl[dialect]
	if !ok {
		return nil, fmt.Errorf("namespaces: open: unknown SQL dialect %q (want sqlite or postgres)", dialect)
	}
	rows, _ := e.(engines.RowClock)
	if dialect == "sqlite" && rows == nil {
		return nil, fmt.Errorf("namespaces: open sqlite: %T keeps no row clock (engines.RowClock) to time intents with; open the database with engines/sqlite", e)
	}
	if err := createSchema(ctx, db, dialect, stmts); err != nil {
		return nil, fmt.Errorf("namespaces: open %s: create schema: %w", dialect, err)
	}
	var permCols bool
	err := retryDeadlock(func() (err error) {
		permCols, err = addPermColumns(ctx, db, dialect)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("namespaces: open %s: add the ns permission columns: %w", dialect, err)
	}
	r := &SQL{db: db, dialect: dialect, clock: orWall(clock), q: newQueries(dialect), noPerm: !permCols}
	r.settles = &settleGroup{db: db}
	if dialect == "sqlite" {
		r.rows = rows
	}
	if r.noPerm {
		// A store made before namespaces had permissions, opened
		// read-only: none is recorded, and none can be.
		r.q.perm = rebind(dialect, `SELECT NULL, NULL, NULL FROM ns WHERE name = ?`)
	}
	r.watchOpen(e)
	if err := retryDeadlock(func() error { return r.prepare(ctx) }); err != nil {
		return nil, fmt.Errorf("namespaces: open %s: prepare: %w", dialect, err)
	}
	return r, nil
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

// prepare prepares the registry's hot statements.
func (r *SQL) prepare(ctx context.Context) error {
	db := r.db
	var prepared []*sql.Stmt
	for _, p := range []struct {
		st **sql.Stmt
		q  string
	}{
		{&r.existsStmt, r.q.exists}, {&r.linkStmt, r.q.linkIf}, {&r.pendStmt, r.q.pend}, {&r.unpendStmt, r.q.unpend},
		{&r.settleTakeStmt, r.q.settleTake}, {&r.settleLinkStmt, r.q.settleLink},
	} {
		st, err := db.PrepareContext(ctx, p.q)
		if err != nil {
			for _, st := range prepared {
				st.Close()
			}
			return err
		}
		*p.st = st
		prepared = append(prepared, st)
	}
	return nil
}

// Dialect is "sqlite" or "postgres".
func (r *SQL) Dialect() string { return r.dialect }

// nowArg stands for the row clock's now in a statement's arguments, where
// the statement has {now}; see args.
type nowArg struct{}

// args resolves the nowArg among a: on SQLite it binds the row clock's
// reading (one for the call); on PostgreSQL, whose statements read the
// server's clock where {now} was, it is dropped.
func (r *SQL) args(a ...any) []any {
	out := a[:0:0]
	var now any
	for _, v := range a {
		if _, ok := v.(nowArg); !ok {
			out = append(out, v)
			continue
		}
		if r.rows == nil {
			continue
		}
		if now == nil {
			now = r.rows.RowNow()
		}
		out = append(out, now)
	}
	return out
}

// querier is what *sql.DB and *sql.Tx share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (r *SQL) exists(ctx context.Context, q querier, name string) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, r.q.exists, name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Create implements Registry.
func (r *SQL) Create(ctx context.Context, name string) error {
	return r.create(ctx, name, nil, nil, nil)
}

// CreatePerm implements Registry.
func (r *SQL) CreatePerm(ctx context.Context, name string, p Perm) error {
	p = p.clean()
	return r.create(ctx, name, int64(p.Uid), int64(p.Gid), int64(p.Mode))
}

func (r *SQL) create(ctx context.Context, name string, uid, gid, mode any) error {
	if err := check(ctx, name); err != nil {
		return wrap("create", name, blob.Digest{}, err)
	}
	res, err := r.db.ExecContext(ctx, r.q.create, name, r.clock.Now().UnixNano(), uid, gid, mode)
	if err != nil {
		return wrap("create", name, blob.Digest{}, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return wrap("create", name, blob.Digest{}, err)
	} else if n == 0 {
		return wrap("create", name, blob.Digest{}, ErrExists)
	}
	return nil
}

// Perm implements Registry.
func (r *SQL) Perm(ctx context.Context, name string) (Perm, bool, error) {
	if err := check(ctx, name); err != nil {
		return Perm{}, false, wrap("perm", name, blob.Digest{}, err)
	}
	var uid, gid, mode sql.NullInt64
	err := r.db.QueryRowContext(ctx, r.q.perm, name).Scan(&uid, &gid, &mode)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Perm{}, false, wrap("perm", name, blob.Digest{}, ErrNotFound)
	case err != nil:
		return Perm{}, false, wrap("perm", name, blob.Digest{}, err)
	case !uid.Valid || !gid.Valid || !mode.Valid:
		return Perm{}, false, nil
	}
	return Perm{Uid: uint32(uid.Int64), Gid: uint32(gid.Int64), Mode: uint32(mode.Int64)}.clean(), true, nil
}

// SetPerm implements Registry.
func (r *SQL) SetPerm(ctx context.Context, name string, p Perm) error {
	if err := check(ctx, name); err != nil {
		return wrap("set perm", name, blob.Digest{}, err)
	}
	if r.noPerm {
		return wrap("set perm", name, blob.Digest{}, blob.ErrReadOnly)
	}
	p = p.clean()
	res, err := r.db.ExecContext(ctx, r.q.setPerm, int64(p.Uid), int64(p.Gid), int64(p.Mode), name)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return wrap("set perm", name, blob.Digest{}, err)
	}
	if n == 0 {
		return wrap("set perm", name, blob.Digest{}, ErrNotFound)
	}
	return nil
}

// createSchema creates the tables and indexes that do not exist yet. On
// SQLite each statement runs on its own, taking the write lock only if it
// creates something (a store on read-only media opens too); on PostgreSQL
// all of them run in one transaction under the schema lock, so that hosts
// opening one database at once do not trip over each other's CREATE TABLE.
func createSchema(ctx context.Context, db *sql.DB, dialect string, stmts []string) error {
	if dialect != "postgres" {
		for _, s := range stmts {
			if _, err := db.ExecContext(ctx, s); err != nil {
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

// Remove implements Registry.
func (r *SQL) Remove(ctx context.Context, name string) error {
	if err := check(ctx, name); err != nil {
		return wrap("remove", name, blob.Digest{}, err)
	}
	res, err := r.db.ExecContext(ctx, r.q.remove, name, name, name)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 1 {
		return nil
	}
	// Say why nothing was deleted.
	ok, cerr := r.exists(ctx, r.db, name)
	switch {
	case cerr != nil:
		return wrap("remove", name, blob.Digest{}, errors.Join(err, cerr))
	case !ok:
		return wrap("remove", name, blob.Digest{}, ErrNotFound)
	case err == nil:
		return wrap("remove", name, blob.Digest{}, ErrNotEmpty)
	}
	// The delete failed. On PostgreSQL a foreign-key violation means a
	// concurrent Link or Pend committed first: not empty after all.
	var refs int64
	if qerr := r.db.QueryRowContext(ctx, r.q.count, name).Scan(&refs); qerr == nil && refs > 0 {
		return wrap("remove", name, blob.Digest{}, ErrNotEmpty)
	}
	if ok, qerr := r.anyPending(ctx, name); qerr == nil && ok {
		return wrap("remove", name, blob.Digest{}, ErrNotEmpty)
	}
	return wrap("remove", name, blob.Digest{}, err)
}

// Exists implements Registry.
func (r *SQL) Exists(ctx context.Context, name string) (bool, error) {
	if err := check(ctx, name); err != nil {
		return false, wrap("exists", name, blob.Digest{}, err)
	}
	ok, err := r.exists(ctx, r.db, name)
	return ok, wrap("exists", name, blob.Digest{}, err)
}

// Names implements Registry.
func (r *SQL) Names(ctx context.Context, after string) iter.Seq2[string, error] {
	return paged(ctx, "names", "", func(first bool, last string) ([]string, error) {
		from := after
		if !first {
			from = last
		}
		rows, err := r.db.QueryContext(ctx, r.q.names, from, pageSize)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := make([]string, 0, pageSize)
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, rows.Err()
	})
}

// Link implements Registry. It runs in its own transaction; see LinkTx.
func (r *SQL) Link(ctx context.Context, name string, d blob.Digest) (bool, error) {
	if err := check(ctx, name); err != nil {
		return false, wrap("link", name, d, err)
	}
	var linked bool
	err := r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		linked, err = r.linkTx(ctx, tx, name, d)
		return err
	})
	if err != nil {
		return false, wrap("link", name, d, err)
	}
	return linked, nil
}

// LinkTx is Link inside the caller's transaction tx, which must belong to
// the registry's database: the reference commits or rolls back with tx.
// This is how a kv put and its link become one (store.WithLink with
// Service.LinkFunc).
func (r *SQL) LinkTx(ctx context.Context, tx *sql.Tx, name string, d blob.Digest) (bool, error) {
	if err := check(ctx, name); err != nil {
		return false, wrap("link", name, d, err)
	}
	linked, err := r.linkTx(ctx, tx, name, d)
	if err != nil {
		return false, wrap("link", name, d, err)
	}
	return linked, nil
}

func (r *SQL) linkTx(ctx context.Context, tx *sql.Tx, name string, d blob.Digest) (bool, error) {
	// One statement inserts only if the namespace exists; no row means
	// already linked or no such namespace.
	res, err := tx.StmtContext(ctx, r.linkStmt).ExecContext(ctx, name, d[:], r.clock.Now().UnixNano(), name)
	if err != nil {
		return false, r.linkFailed(ctx, name, err)
	}
	n, err := res.RowsAffected()
	if err != nil || n == 1 {
		return n == 1, err
	}
	return false, r.mustExist(ctx, tx, name)
}

// Pend implements Registry, in its own transaction. When the intent was
// written and the COMMIT then failed, Pend returns the intent with the
// error: the COMMIT may have reached the server and its answer been lost
// (a connection reset), so the row may exist. The caller, which reports
// the failure, drops it (Lease.Abandon); otherwise it would stay pending
// under a live holder, renewed, and be linked at the lease's Close — a
// close that failed published at unmount.
func (r *SQL) Pend(ctx context.Context, name string, d blob.Digest, p Pending) (Intent, error) {
	var i Intent
	err := r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		i, err = r.PendTx(ctx, tx, name, d, p)
		return err
	})
	if err != nil && i == 0 {
		return 0, err
	}
	return i, err
}

// PendTx implements TxLinker: the intent commits or rolls back with tx,
// and so does the removal of the one it replaces.
func (r *SQL) PendTx(ctx context.Context, tx *sql.Tx, name string, d blob.Digest, p Pending) (Intent, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("pend", name, d, err)
	}
	if p.Holder == "" {
		return 0, wrap("pend", name, d, errors.New("an intent needs a holder"))
	}
	if p.Replaces != 0 {
		if err := r.CancelTx(ctx, tx, p.Replaces); err != nil {
			return 0, err
		}
	}
	i := newIntent()
	res, err := r.txExec(ctx, tx, r.pendStmt, r.q.pend, r.args(int64(i), name, d[:], p.Holder, nowArg{}, int64(p.TTL), name)...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	} else {
		err = r.linkFailed(ctx, name, err)
	}
	if err == nil && n == 0 {
		err = ErrNotFound
	}
	if err != nil {
		return 0, wrap("pend", name, d, err)
	}
	return i, nil
}

// Settle implements Registry.
func (r *SQL) Settle(ctx context.Context, i Intent) (bool, error) {
	now := r.clock.Now().UnixNano()
	if r.dialect == "postgres" {
		linked, err := r.settles.do(ctx, i, now)
		if err != nil {
			return false, wrap("settle", "", blob.Digest{}, err)
		}
		return linked, nil
	}
	var linked bool
	settle := func(ctx context.Context, tx *sql.Tx) error {
		var name string
		var b []byte
		err := tx.StmtContext(ctx, r.settleTakeStmt).QueryRowContext(ctx, int64(i)).Scan(&name, &b)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		res, err := tx.StmtContext(ctx, r.settleLinkStmt).ExecContext(ctx, name, b, now)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		linked = n == 1
		return err
	}
	// Lazy: nobody waits for a RELEASE, and a sequential writer's next
	// close commits this link with its own publish.
	if err := r.write(ctx, true, settle); err != nil {
		return false, wrap("settle", "", blob.Digest{}, err)
	}
	return linked, nil
}

// Cancel implements Registry.
func (r *SQL) Cancel(ctx context.Context, i Intent) error {
	if _, err := r.unpendStmt.ExecContext(ctx, int64(i)); err != nil {
		return wrap("cancel", "", blob.Digest{}, err)
	}
	return nil
}

// CancelTx implements TxLinker.
func (r *SQL) CancelTx(ctx context.Context, tx *sql.Tx, i Intent) error {
	if _, err := r.txExec(ctx, tx, r.unpendStmt, r.q.unpend, int64(i)); err != nil {
		return wrap("cancel", "", blob.Digest{}, err)
	}
	return nil
}

// txExec runs a hot statement of a put's transaction: st, prepared once,
// on SQLite; on PostgreSQL its text q, which pgx prepares once per pooled
// connection and keeps in that connection's statement cache. A
// database/sql Stmt would cost two round trips more per put there: the
// pool hands database/sql a fresh driver connection for every
// transaction, on which st is prepared again, and deallocated when the
// transaction ends.
func (r *SQL) txExec(ctx context.Context, tx *sql.Tx, st *sql.Stmt, q string, args ...any) (sql.Result, error) {
	if r.dialect == "postgres" {
		return tx.ExecContext(ctx, q, args...)
	}
	return tx.StmtContext(ctx, st).ExecContext(ctx, args...)
}

// Renew implements Registry: one UPDATE over the holder's index.
func (r *SQL) Renew(ctx context.Context, holder string, ttl time.Duration) error {
	if _, err := r.db.ExecContext(ctx, r.q.renew, r.args(nowArg{}, int64(ttl), holder)...); err != nil {
		return wrap("renew", "", blob.Digest{}, err)
	}
	return nil
}

// Recover implements Registry, in one transaction (one statement on
// PostgreSQL). Lapse is judged on the row clock; the references it makes
// are stamped with the registry's Clock.
func (r *SQL) Recover(ctx context.Context, holder string) (int, error) {
	linkedAt := r.clock.Now().UnixNano()
	var n int64
	var err error
	if r.dialect == "postgres" {
		err = r.db.QueryRowContext(ctx, r.q.recoverTake, holder, linkedAt).Scan(&n)
	} else {
		err = r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			// One reading for both statements: an intent that lapsed
			// between them would be taken without being linked.
			now := r.rows.RowNow()
			if _, err := tx.ExecContext(ctx, r.q.recoverLink, linkedAt, holder, now); err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, r.q.recoverTake, holder, now)
			if err == nil {
				n, err = res.RowsAffected()
			}
			return err
		})
	}
	if err != nil {
		return 0, wrap("recover", "", blob.Digest{}, err)
	}
	return int(n), nil
}

// Holders implements Registry.
func (r *SQL) Holders(ctx context.Context) ([]string, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT DISTINCT holder FROM ns_pending`)
	if err != nil {
		return nil, wrap("holders", "", blob.Digest{}, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			return nil, wrap("holders", "", blob.Digest{}, err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("holders", "", blob.Digest{}, err)
	}
	return out, nil
}

func (r *SQL) anyPending(ctx context.Context, name string) (bool, error) {
	var one int
	err := r.db.QueryRowContext(ctx, rebind(r.dialect, `SELECT 1 FROM ns_pending WHERE ns = ? LIMIT 1`), name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// mustExist returns ErrNotFound unless the namespace exists, read in tx:
// with SQLite's IMMEDIATE transactions nothing can remove it before the
// insert that follows; on PostgreSQL the foreign key catches a concurrent
// Remove (see linkFailed).
func (r *SQL) mustExist(ctx context.Context, tx *sql.Tx, name string) error {
	var one int
	err := tx.StmtContext(ctx, r.existsStmt).QueryRowContext(ctx, name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// linkFailed turns an insert's foreign-key violation (the namespace was
// removed after mustExist, PostgreSQL only) into ErrNotFound. It re-checks
// outside the transaction, which a failed statement may have aborted.
func (r *SQL) linkFailed(ctx context.Context, name string, err error) error {
	if ok, cerr := r.exists(ctx, r.db, name); cerr == nil && !ok {
		return ErrNotFound
	}
	return err
}

// LinkMany implements Registry: one transaction, linkBatch rows per INSERT.
func (r *SQL) LinkMany(ctx context.Context, name string, ds []blob.Digest) (int, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("linkmany", name, blob.Digest{}, err)
	}
	now := r.clock.Now().UnixNano()
	// Inserting in key order turns random B-tree inserts into near-appends
	// on both the primary key and the digest index: 2.5× faster for random
	// batches on SQLite, 10× when the caller's batches are ordered too.
	ds = slices.Clone(ds)
	slices.SortFunc(ds, blob.Digest.Compare)
	ds = slices.Compact(ds)
	total := 0
	err := r.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		total = 0
		if err := r.mustExist(ctx, tx, name); err != nil {
			return err
		}
		var full *sql.Stmt
		if len(ds) >= linkBatch {
			st, err := tx.PrepareContext(ctx, r.q.linkRows)
			if err != nil {
				return err
			}
			defer st.Close()
			full = st
		}
		args := make([]any, 0, 3*linkBatch)
		for rest := ds; len(rest) > 0; {
			k := min(len(rest), linkBatch)
			args = args[:0]
			for i := range rest[:k] {
				args = append(args, name, rest[i][:], now)
			}
			q := ""
			if k < linkBatch {
				q = linkRowsQuery(r.dialect, k)
			}
			n, err := r.linkRowsExec(ctx, tx, full, q, args)
			if err != nil {
				return r.linkFailed(ctx, name, err)
			}
			total += n
			rest = rest[k:]
		}
		return nil
	})
	if err != nil {
		return 0, wrap("linkmany", name, blob.Digest{}, err)
	}
	return total, nil
}

// linkRowsExec runs one multi-row link statement (st, or q when st is nil
// or q is set) and returns how many references it added.
func (r *SQL) linkRowsExec(ctx context.Context, tx *sql.Tx, st *sql.Stmt, q string, args []any) (int, error) {
	var res sql.Result
	var err error
	if q != "" {
		res, err = tx.ExecContext(ctx, q, args...)
	} else {
		res, err = st.ExecContext(ctx, args...)
	}
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// inTx is write, eager. f gets the context to use, which on SQLite is the
// Batcher's: a caller canceled midway must not interrupt a statement of a
// transaction other writers share (engines.Batcher).
func (r *SQL) inTx(ctx context.Context, f func(ctx context.Context, tx *sql.Tx) error) error {
	return r.write(ctx, false, f)
}

// write runs fn in a write transaction: through the engine's Batcher when
// it has one (SQLite), lazily if asked (engines.Batcher), so that the
// registry's writes queue with the puts; in one of its own otherwise.
func (r *SQL) write(ctx context.Context, lazy bool, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if r.batch != nil {
		return r.batch.Do(ctx, lazy, fn)
	}
	return engines.InTx(ctx, r.db, nil, func(tx *sql.Tx) error { return fn(ctx, tx) })
}

// Unlink implements Registry.
func (r *SQL) Unlink(ctx context.Context, name string, d blob.Digest) error {
	if err := check(ctx, name); err != nil {
		return wrap("unlink", name, d, err)
	}
	res, err := r.db.ExecContext(ctx, r.q.unlink, name, d[:])
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil || n == 1 {
		return wrap("unlink", name, d, err)
	}
	return wrap("unlink", name, d, r.absent(ctx, name, blob.ErrMissing))
}

// absent explains a miss: ErrNotFound if the namespace is gone, else miss.
func (r *SQL) absent(ctx context.Context, name string, miss error) error {
	ok, err := r.exists(ctx, r.db, name)
	switch {
	case err != nil:
		return err
	case !ok:
		return ErrNotFound
	}
	return miss
}

// Has implements Registry.
func (r *SQL) Has(ctx context.Context, name string, d blob.Digest) (Ref, bool, error) {
	if err := check(ctx, name); err != nil {
		return Ref{}, false, wrap("has", name, d, err)
	}
	var at int64
	err := r.db.QueryRowContext(ctx, r.q.has, name, d[:]).Scan(&at)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Ref{}, false, wrap("has", name, d, r.absent(ctx, name, nil))
	case err != nil:
		return Ref{}, false, wrap("has", name, d, err)
	}
	return Ref{Digest: d, LinkedAt: time.Unix(0, at)}, true, nil
}

// hasManyBatch bounds the IN list of one HasMany query.
const hasManyBatch = 500

// HasMany implements Registry with IN-list queries of up to hasManyBatch
// digests.
func (r *SQL) HasMany(ctx context.Context, name string, ds []blob.Digest) ([]bool, error) {
	if err := check(ctx, name); err != nil {
		return nil, wrap("has", name, blob.Digest{}, err)
	}
	found := make(map[blob.Digest]bool, len(ds))
	for lo := 0; lo < len(ds); lo += hasManyBatch {
		batch := ds[lo:min(len(ds), lo+hasManyBatch)]
		args := make([]any, 0, len(batch)+1)
		args = append(args, name)
		for _, d := range batch {
			args = append(args, d[:])
		}
		q := rebind(r.dialect, "SELECT digest FROM ns_refs WHERE ns = ? AND digest IN (?"+strings.Repeat(", ?", len(batch)-1)+")")
		rows, err := r.db.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, wrap("has", name, blob.Digest{}, err)
		}
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				rows.Close()
				return nil, wrap("has", name, blob.Digest{}, err)
			}
			d, err := blob.FromBytes(b)
			if err != nil {
				rows.Close()
				return nil, wrap("has", name, blob.Digest{}, err)
			}
			found[d] = true
		}
		if err := rows.Close(); err != nil {
			return nil, wrap("has", name, blob.Digest{}, err)
		}
		if err := rows.Err(); err != nil {
			return nil, wrap("has", name, blob.Digest{}, err)
		}
	}
	out := make([]bool, len(ds))
	some := false
	for i, d := range ds {
		out[i] = found[d]
		some = some || out[i]
	}
	if !some {
		// Nothing found: the namespace may be absent.
		if err := r.absent(ctx, name, nil); err != nil {
			return nil, wrap("has", name, blob.Digest{}, err)
		}
	}
	return out, nil
}

// Count implements Registry. It counts the namespace's primary-key range,
// O(references); see the package doc.
func (r *SQL) Count(ctx context.Context, name string) (int64, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("count", name, blob.Digest{}, err)
	}
	var n int64
	if err := r.db.QueryRowContext(ctx, r.q.count, name).Scan(&n); err != nil {
		return 0, wrap("count", name, blob.Digest{}, err)
	}
	if n == 0 {
		return 0, wrap("count", name, blob.Digest{}, r.absent(ctx, name, nil))
	}
	return n, nil
}

// Entries implements Registry.
func (r *SQL) Entries(ctx context.Context, name string, after blob.Digest) iter.Seq2[Ref, error] {
	if err := ValidName(name); err != nil {
		return fail[Ref](wrap("entries", name, blob.Digest{}, err))
	}
	return paged(ctx, "entries", name, func(first bool, last Ref) ([]Ref, error) {
		from := last.Digest[:]
		if first {
			from = key(after)
		}
		rows, err := r.db.QueryContext(ctx, r.q.entries, name, from, pageSize)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := make([]Ref, 0, pageSize)
		for rows.Next() {
			var b []byte
			var at int64
			if err := rows.Scan(&b, &at); err != nil {
				return nil, err
			}
			d, err := blob.FromBytes(b)
			if err != nil {
				return nil, err
			}
			out = append(out, Ref{Digest: d, LinkedAt: time.Unix(0, at)})
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if first && len(out) == 0 {
			return nil, r.absent(ctx, name, nil)
		}
		return out, nil
	})
}

// IsLive implements gc.Source with one index probe on ns_refs(digest) and,
// if that misses, one on ns_pending(digest).
func (r *SQL) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	var one int
	err := r.db.QueryRowContext(ctx, r.q.isLive, d[:], d[:]).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, wrap("islive", "", d, err)
	}
	return true, nil
}

// LiveAmong implements gc.BatchSource: which of ds any namespace
// references, in one query.
func (r *SQL) LiveAmong(ctx context.Context, ds []blob.Digest) (map[blob.Digest]bool, error) {
	return r.liveAmong(ctx, r.db, ds)
}

// LiveAmongTx implements gc.TxSource: the same query inside the
// collector's arbitration transaction, so that a link committed by any
// process before the arbitration's key locks were granted is seen.
func (r *SQL) LiveAmongTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error) {
	return r.liveAmong(ctx, tx, ds)
}

func (r *SQL) liveAmong(ctx context.Context, q querier, ds []blob.Digest) (map[blob.Digest]bool, error) {
	live := make(map[blob.Digest]bool)
	if len(ds) == 0 {
		return live, nil
	}
	args := make([]any, 2*len(ds))
	for i, d := range ds {
		args[i], args[len(ds)+i] = d[:], d[:]
	}
	in := "(?" + strings.Repeat(", ?", len(ds)-1) + ")"
	query := rebind(r.dialect, "SELECT digest FROM ns_refs WHERE digest IN "+in+" UNION SELECT digest FROM ns_pending WHERE digest IN "+in)
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap("islive", "", blob.Digest{}, err)
	}
	defer rows.Close()
	if err := engines.ScanDigests(rows, func(d blob.Digest) { live[d] = true }); err != nil {
		return nil, wrap("islive", "", blob.Digest{}, err)
	}
	return live, nil
}

// Live implements gc.Source: the union of the ns_refs(digest) and
// ns_pending(digest) indexes, paged by key.
func (r *SQL) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return paged(ctx, "live", "", func(first bool, last blob.Digest) ([]blob.Digest, error) {
		from := last[:]
		if first {
			from = key(blob.Digest{})
		}
		rows, err := r.db.QueryContext(ctx, r.q.live, from, from, pageSize)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := make([]blob.Digest, 0, pageSize)
		err = engines.ScanDigests(rows, func(d blob.Digest) { out = append(out, d) })
		return out, err
	})
}

// key is the lower bound of a listing that starts after d. The zero digest
// binds as the empty blob, which sorts below every 32-byte key in both
// dialects, so a listing from zero includes the zero digest itself.
func key(d blob.Digest) []byte {
	if d.IsZero() {
		return []byte{}
	}
	return d[:]
}

// settleGroup settles the intents of concurrent callers in one statement
// on PostgreSQL (settleManySQL): a cp -r of small files settles one per
// file at its RELEASE, and a statement each was a round trip and a
// transaction each. One statement runs at a time; the settles that arrive
// meanwhile go together in the next. The statement is one transaction, so
// it links every intent of the group or none: a failure is every caller's,
// and each retries (Lease).
type settleGroup struct {
	db *sql.DB

	mu      sync.Mutex
	queue   []*settleJob
	running bool
}

type settleJob struct {
	i      Intent
	now    int64 // linked_at
	ctx    context.Context
	linked bool
	err    error
	done   chan struct{}
}

// settleGroupMax bounds the intents of one statement.
const settleGroupMax = 256

// settleManySQL takes the intents $1 and links their (namespace, digest)
// pairs, inserted in key order (two hosts' groups never wait for each
// other in a cycle), stamped $2. It returns, for each pair it linked anew,
// the smallest of the intents that named it: that settle linked, the
// others found it linked.
const settleManySQL = `WITH p AS (DELETE FROM ns_pending WHERE id = ANY($1::bigint[]) RETURNING id, ns, digest),
	l AS (INSERT INTO ns_refs (ns, digest, linked_at)
		SELECT DISTINCT ns, digest, $2::bigint FROM p ORDER BY ns, digest
		ON CONFLICT (ns, digest) DO NOTHING RETURNING ns, digest)
	SELECT min(p.id) FROM p JOIN l ON p.ns = l.ns AND p.digest = l.digest GROUP BY p.ns, p.digest`

// do settles i with the next group and reports whether it linked. The
// statement runs with the context of the group's first caller, without
// its cancellation: it is the other callers' statement too.
func (g *settleGroup) do(ctx context.Context, i Intent, now int64) (bool, error) {
	j := &settleJob{i: i, now: now, ctx: context.WithoutCancel(ctx), done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, j)
	start := !g.running
	g.running = true
	g.mu.Unlock()
	if start {
		go g.run()
	}
	<-j.done
	return j.linked, j.err
}

func (g *settleGroup) run() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		n := min(len(g.queue), settleGroupMax)
		jobs := slices.Clone(g.queue[:n])
		g.queue = slices.Delete(g.queue, 0, n)
		g.mu.Unlock()
		g.settle(jobs)
	}
}

func (g *settleGroup) settle(jobs []*settleJob) {
	defer func() {
		for _, j := range jobs {
			close(j.done)
		}
	}()
	ids := make([]int64, len(jobs))
	for k, j := range jobs {
		ids[k] = int64(j.i)
	}
	linked := make(map[int64]bool)
	rows, err := g.db.QueryContext(jobs[0].ctx, settleManySQL, ids, jobs[0].now)
	if err == nil {
		for rows.Next() {
			var id int64
			if err = rows.Scan(&id); err != nil {
				break
			}
			linked[id] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for _, j := range jobs {
		j.linked, j.err = err == nil && linked[int64(j.i)], err
		delete(linked, int64(j.i)) // an intent settled twice links once
	}
}
