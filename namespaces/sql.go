package namespaces

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
)

// SQL is a Registry kept in three tables of a database/sql database,
// normally the kv engine's own (see Open), so that links survive restarts
// and can commit in the same transaction as a put (LinkTx): ns (names,
// permissions, usage), ns_refs (references) and ns_pending (intents).
// Their schema and migrations are package meta's (meta/ns_schema.go,
// meta.OpenNSTables), where their statements go next (issue 36, stage 2;
// docs/architecture.md, "How one close commits").
//
// Times are unix nanoseconds. linked_at and created_at are the registry's
// Clock (wall time). An intent's expiry is the row clock's, which every
// process sharing the database reads alike: the server's on PostgreSQL
// (engines.PGNow, read in the statement), the engine's on SQLite
// (engines.RowClock, bound); writers pass a TTL. Every DML statement is
// shared between the dialects, with `?` placeholders rebound to `$n` for
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
	lockStmt, heldStmt, pendHeldStmt           *sql.Stmt
	chargeStmt                                 *sql.Stmt
	// batch, when the engine has one (SQLite), carries the registry's
	// write transactions (write), settles lazily.
	batch *engines.Batcher
	// settles groups concurrent settles in one statement (PostgreSQL).
	settles *settleGroup
	// noPerm: the ns table has no permission columns (an older store on
	// read-only media): Perm reports none.
	noPerm bool
	// noUsage: the tables have no usage columns (an older store on
	// read-only media): Usage fails, and nothing can be written anyway.
	noUsage bool
	// pends, when the engine has it (PostgreSQL), carries the intents of
	// puts into the put's own batch statement (PendTx).
	pends pendDeferrer
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

type queries struct {
	create, remove, exists, names   string
	perm, setPerm                   string
	linkIf, has, count, entries     string
	pend, settleTake, settleLink    string
	renew, recoverTake, recoverLink string
	isLive, live                    string
	// usage (sql_usage.go)
	lockNS, held, pendHeld, charge       string
	takeRef, intentNS, takeIntent, usage string
	unique, recount, setQuota, setUsage  string
	linkRows                             string // linkBatch rows per INSERT
	anyPending                           string
}

// linkBatch is how many rows one LinkMany INSERT carries: 1024 bind
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

		linkIf:  r(`INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM ns WHERE name = ?) ON CONFLICT (ns, digest) DO NOTHING`),
		has:     r(`SELECT linked_at FROM ns_refs WHERE ns = ? AND digest = ?`),
		count:   r(`SELECT COUNT(*) FROM ns_refs WHERE ns = ?`),
		entries: r(`SELECT digest, linked_at FROM ns_refs WHERE ns = ? AND digest > ? ORDER BY digest LIMIT ?`),

		pend:  r(`INSERT INTO ns_pending (id, ns, digest, holder, expiry, size) SELECT ?, ?, ?, ?, {now} + ?, ? WHERE EXISTS (SELECT 1 FROM ns WHERE name = ?)`),
		renew: r(`UPDATE ns_pending SET expiry = {now} + ? WHERE holder = ?`),
		// Settle and Recover on SQLite: take the rows, then link them, in
		// one IMMEDIATE transaction.
		settleTake:  r(`DELETE FROM ns_pending WHERE id = ? RETURNING ns, digest, size`),
		settleLink:  r(`INSERT INTO ns_refs (ns, digest, linked_at, size) VALUES (?, ?, ?, ?) ON CONFLICT (ns, digest) DO NOTHING`),
		recoverLink: r(`INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ns, digest, ?, max(size) FROM ns_pending WHERE holder = ? OR expiry < {now} GROUP BY ns, digest ON CONFLICT (ns, digest) DO NOTHING`),
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
		// Each first locks the namespaces' rows it settles into (k), as
		// every writer that changes what a namespace holds does
		// (sql_usage.go): an Unlink of the digest an intent settles into
		// must not judge it unheld by the intent this statement takes.
		q.settleTake = `WITH k AS (SELECT name FROM ns WHERE name = (SELECT ns FROM ns_pending WHERE id = $1) FOR NO KEY UPDATE),
			p AS (DELETE FROM ns_pending WHERE id = $1 AND ns IN (SELECT name FROM k) RETURNING ns, digest, size),
			l AS (INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ns, digest, $2::bigint, size FROM p ON CONFLICT (ns, digest) DO NOTHING RETURNING 1)
			SELECT count(*) FROM l`
		q.recoverTake = `WITH k AS (SELECT name FROM ns WHERE name IN (SELECT ns FROM ns_pending WHERE holder = $1 OR expiry < ` + now + `) ORDER BY name FOR NO KEY UPDATE),
			p AS (DELETE FROM ns_pending WHERE (holder = $1 OR expiry < ` + now + `) AND ns IN (SELECT name FROM k) RETURNING ns, digest, size),
			l AS (INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ns, digest, $2::bigint, max(size) FROM p GROUP BY ns, digest ON CONFLICT (ns, digest) DO NOTHING)
			SELECT count(*) FROM p`
	}
	q.usageQueries(dialect)
	q.linkRows = linkRowsQuery(dialect, linkBatch)
	return q
}

func linkRowsQuery(dialect string, rows int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ns_refs (ns, digest, linked_at, size) VALUES `)
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?)")
	}
	b.WriteString(` ON CONFLICT (ns, digest) DO NOTHING RETURNING digest, size`)
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
	rows, _ := e.(engines.RowClock)
	if dialect == "sqlite" && rows == nil {
		return nil, fmt.Errorf("namespaces: open sqlite: %T keeps no row clock (engines.RowClock) to time intents with; open the database with engines/sqlite", e)
	}
	schema, err := meta.OpenNSTables(ctx, db, dialect)
	if err != nil {
		return nil, fmt.Errorf("namespaces: open %s: %w", dialect, err)
	}
	r := &SQL{db: db, dialect: dialect, clock: orWall(clock), q: newQueries(dialect), noPerm: !schema.Perm, noUsage: !schema.Usage}
	r.settles = &settleGroup{db: db}
	r.pends, _ = e.(pendDeferrer)
	if dialect == "sqlite" {
		r.rows = rows
	}
	if r.noPerm {
		// A store made before namespaces had permissions, opened
		// read-only: none is recorded, and none can be.
		r.q.perm = rebind(dialect, `SELECT NULL, NULL, NULL FROM ns WHERE name = ?`)
	}
	r.watchOpen(e)
	if err := meta.RetryDeadlock(func() error { return r.prepare(ctx) }); err != nil {
		return nil, fmt.Errorf("namespaces: open %s: prepare: %w", dialect, err)
	}
	if schema.UsageAdded {
		// The rows made before usage was kept are counted once, now;
		// their sizes are unknown (0) until Service.FillSizes.
		if _, err := r.Recount(ctx); err != nil {
			return nil, fmt.Errorf("namespaces: open %s: count the usage of a store made before it was kept: %w", dialect, err)
		}
	}
	return r, nil
}

// prepare prepares the registry's hot statements.
func (r *SQL) prepare(ctx context.Context) error {
	db := r.db
	var prepared []*sql.Stmt
	stmts := []struct {
		st **sql.Stmt
		q  string
	}{{&r.existsStmt, r.q.exists}}
	if !r.noUsage {
		// The rest name the usage columns, which an older store on
		// read-only media lacks; it writes nothing (see writable).
		stmts = append(stmts, []struct {
			st **sql.Stmt
			q  string
		}{
			{&r.linkStmt, r.q.linkIf}, {&r.pendStmt, r.q.pend}, {&r.unpendStmt, r.q.takeIntent},
			{&r.settleTakeStmt, r.q.settleTake}, {&r.settleLinkStmt, r.q.settleLink},
			{&r.lockStmt, r.q.lockNS}, {&r.heldStmt, r.q.held}, {&r.pendHeldStmt, r.q.pendHeld}, {&r.chargeStmt, r.q.charge},
		}...)
	}
	for _, p := range stmts {
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

// writable fails a write on an older store opened on read-only media
// (noUsage), whose statements are not prepared.
func (r *SQL) writable() error {
	if r.noUsage {
		return errNoUsage
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
