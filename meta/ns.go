package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Links is the namespaces' rows in a database/sql database (the kv
// engine's own): names, their references (links) and intents, and the
// usage counters kept from them (ns_schema.go has the tables). Package
// namespaces decides what they mean — valid names, who may do what,
// writers' leases, when an intent settles, the quotas it sets — and
// reaches them only through these operations; every statement of the
// tables is here.
//
// Links validates nothing a caller decides: the caller checks names and
// sizes first. Errors are the database's, or ErrNSNotFound, ErrNSExists,
// ErrNSNotEmpty, blob.ErrMissing (no such reference), an error from QuotaError (wrapping blob.ErrQuota)
// (wrapping blob.ErrQuota) or blob.ErrReadOnly; the caller names the
// operation.
//
// Times are unix nanoseconds. linked_at and created_at are the caller's
// wall clock (LinksConfig.Wall). An intent's expiry is the row clock's,
// which every process sharing the database reads alike: the server's on
// PostgreSQL (engines.PGNow, read in the statement), the engine's on
// SQLite (engines.RowClock, bound); writers pass a TTL. Every DML
// statement is shared between the dialects, with `?` placeholders rebound
// to `$n` for PostgreSQL and {now} standing for the row clock (see args).
//
// On SQLite the pool must begin transactions IMMEDIATE (_txlock=immediate,
// as engines/sqlite does): a link reads and then writes in one
// transaction.
type Links struct {
	db      *sql.DB
	dialect string
	name    string // the engine's (else the dialect), for messages
	wall    func() time.Time
	// rows is the row clock on SQLite; nil on PostgreSQL, whose
	// statements read the server's.
	rows engines.RowClock
	q    nsQueries
	// The statements of a put's joint link, prepared once: parsing them
	// per put was a tenth of the CPU of a `cp -r` of small files.
	existsStmt, linkStmt, pendStmt, unpendStmt *sql.Stmt
	settleTakeStmt, settleLinkStmt             *sql.Stmt
	lockStmt, heldStmt, pendHeldStmt           *sql.Stmt
	chargeStmt                                 *sql.Stmt
	quotaStmt                                  *sql.Stmt // unlimited's, SQLite only
	// batch, when the engine has one (SQLite), carries the write
	// transactions (write), settles lazily.
	batch *Batcher
	// settles groups concurrent settles in one statement (PostgreSQL).
	settles *settleGroup
	// noPerm: the ns table has no permission columns (an older store on
	// read-only media): Perm reports none.
	noPerm bool
	// noUsage: the tables have no usage columns (an older store on
	// read-only media): Usage fails, and nothing can be written anyway.
	noUsage bool
	// usageAdded: the open added the usage columns (NeedsRecount).
	usageAdded bool
}

// LinksConfig is what OpenLinks needs.
type LinksConfig struct {
	// Engine is the kv engine whose database keeps the rows: "sqlite"
	// or "postgres". A SQLite engine must be an engines.RowClock, which
	// times the intents.
	Engine engines.SQL
	// Batch, if set, carries every write transaction (SQLite's Batcher).
	Batch *Batcher
	// Wall stamps linked_at and created_at; nil means time.Now.
	Wall func() time.Time
	// Origin, on PostgreSQL, makes every statement that commits a change
	// another host's cache must learn of (a namespace created, its
	// permissions changed, it removed, a reference unlinked) notify it on
	// NSNotifyChannel, in the same statement.
	Origin string
}

// NSNotifyChannel is the PostgreSQL channel that namespace changes are
// notified on (LISTEN/NOTIFY), in the kv database. A notification's
// payload is "<kind> <origin> <namespace> [<digest hex>]", kind c
// (created), p (permissions changed), r (removed) or u (a reference
// unlinked, with its digest); namespace names hold no space. The server
// delivers it when the change commits, never for one that rolls back,
// and it costs no round trip.
const NSNotifyChannel = "alkblobfs_ns"

// The namespaces' sentinels; package namespaces exports them under its
// own names (namespaces.ErrExists, ErrNotEmpty, ErrNotFound).
var (
	ErrNSExists   = errors.New("namespace exists")
	ErrNSNotEmpty = errors.New("namespace not empty")
	ErrNSNotFound = errors.New("namespace not found")
)

// errNoUsage: an older store opened on read-only media has no usage
// columns, and cannot be given them.
var errNoUsage = fmt.Errorf("%w: the store predates namespace usage; open it writable once to add it", blob.ErrReadOnly)

// NSPerm is a namespace's recorded owner, group and permission bits.
type NSPerm struct{ Uid, Gid, Mode uint32 }

// Ref is one reference of a namespace to a digest.
type Ref struct {
	Digest blob.Digest
	// LinkedAt is when the digest was first linked into the namespace (the
	// file's mtime on the mount). Re-linking keeps it.
	LinkedAt time.Time
}

// Sized is a digest with its blob's logical size, for the batch links.
type Sized struct {
	Digest blob.Digest
	Size   int64
}

// NSIntent is an intent being recorded (namespaces.Pending).
type NSIntent struct {
	ID       int64 // chosen by the caller before the put; 0: NewIntentID
	Holder   string
	TTL      time.Duration
	Replaces int64 // an intent this one replaces, dropped first; 0: none
	Size     int64
	// admitted: the quota was judged already (linkTx)
	admitted bool
}

// NewIntentID returns a random non-zero intent id.
func NewIntentID() int64 {
	for {
		if i := rand.Int64(); i != 0 {
			return i
		}
	}
}

// OpenLinks creates the namespaces' tables in the engine's database if
// needed (OpenNSTables) and prepares their statements.
func OpenLinks(ctx context.Context, cfg LinksConfig) (*Links, error) {
	db, dialect := cfg.Engine.DB(), cfg.Engine.Dialect()
	rows, _ := cfg.Engine.(engines.RowClock)
	if dialect == "sqlite" && rows == nil {
		return nil, fmt.Errorf("open sqlite: %T keeps no row clock (engines.RowClock) to time intents with; open the database with engines/sqlite", cfg.Engine)
	}
	schema, err := OpenNSTables(ctx, db, dialect)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dialect, err)
	}
	l := &Links{db: db, dialect: dialect, name: dialect, wall: cfg.Wall, q: newNSQueries(dialect), batch: cfg.Batch,
		noPerm: !schema.Perm, noUsage: !schema.Usage, usageAdded: schema.UsageAdded}
	if l.wall == nil {
		l.wall = time.Now
	}
	if e, ok := cfg.Engine.(engines.Engine); ok {
		l.name = e.Name()
	}
	l.settles = newSettleGroup(db)
	if dialect == "sqlite" {
		l.rows = rows
	}
	if l.noPerm {
		// A store made before namespaces had permissions, opened
		// read-only: none is recorded, and none can be.
		l.q.perm = rebindNS(dialect, `SELECT NULL, NULL, NULL FROM ns WHERE name = ?`)
	}
	if dialect == "postgres" && cfg.Origin != "" {
		l.q.notifying(cfg.Origin)
	}
	if err := retryDeadlock(func() error { return l.prepare(ctx) }); err != nil {
		return nil, fmt.Errorf("open %s: prepare: %w", dialect, err)
	}
	if cfg.Batch != nil && cfg.Batch.journal != nil {
		cfg.Batch.journal.links.Store(l)
	}
	return l, nil
}

// NeedsRecount reports that the open added the usage columns: the rows
// made before usage was kept must be counted once (Recount); their sizes
// are unknown (0) until namespaces.Service.FillSizes.
func (l *Links) NeedsRecount() bool { return l.usageAdded }

// UsageKept fails, wrapping blob.ErrReadOnly, when the tables keep no
// usage: an older store opened on read-only media, which fails every
// write and every read of usage likewise.
func (l *Links) UsageKept() error { return l.writable() }

// Dialect is "sqlite" or "postgres".
func (l *Links) Dialect() string { return l.dialect }

// prepare prepares the hot statements.
func (l *Links) prepare(ctx context.Context) error {
	type stmt struct {
		st **sql.Stmt
		q  string
	}
	stmts := []stmt{{&l.existsStmt, l.q.exists}}
	if !l.noUsage {
		// The rest name the usage columns, which an older store on
		// read-only media lacks; it writes nothing (see writable).
		stmts = append(stmts,
			stmt{&l.linkStmt, l.q.linkIf}, stmt{&l.pendStmt, l.q.pend}, stmt{&l.unpendStmt, l.q.takeIntent},
			stmt{&l.settleTakeStmt, l.q.settleTake}, stmt{&l.settleLinkStmt, l.q.settleLink},
			stmt{&l.lockStmt, l.q.lockNS}, stmt{&l.heldStmt, l.q.held}, stmt{&l.pendHeldStmt, l.q.pendHeld}, stmt{&l.chargeStmt, l.q.charge})
		if l.dialect == "sqlite" {
			stmts = append(stmts, stmt{&l.quotaStmt, `SELECT quota_blobs, quota_bytes FROM ns WHERE name = ?`})
		}
	}
	var prepared []*sql.Stmt
	for _, p := range stmts {
		st, err := l.db.PrepareContext(ctx, p.q)
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
func (l *Links) writable() error {
	if l.noUsage {
		return errNoUsage
	}
	return nil
}

// nowArg stands for the row clock's now in a statement's arguments, where
// the statement has {now}; see args.
type nowArg struct{}

// args resolves the nowArg among a: on SQLite it binds the row clock's
// reading (one for the call); on PostgreSQL, whose statements read the
// server's clock where {now} was, it is dropped.
func (l *Links) args(a ...any) []any {
	out := a[:0:0]
	var now any
	for _, v := range a {
		if _, ok := v.(nowArg); !ok {
			out = append(out, v)
			continue
		}
		if l.rows == nil {
			continue
		}
		if now == nil {
			now = l.rows.RowNow()
		}
		out = append(out, now)
	}
	return out
}

// Exists reports whether the namespace exists.
func (l *Links) Exists(ctx context.Context, name string) (bool, error) {
	return l.exists(ctx, l.db, name)
}

func (l *Links) exists(ctx context.Context, q engines.Querier, name string) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, l.q.exists, name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Create records the namespace, with perm if not nil. ErrNSExists if it
// exists.
func (l *Links) Create(ctx context.Context, name string, perm *NSPerm) error {
	var uid, gid, mode any
	if perm != nil {
		uid, gid, mode = int64(perm.Uid), int64(perm.Gid), int64(perm.Mode)
	}
	res, err := l.db.ExecContext(ctx, l.q.create, name, l.wall().UnixNano(), uid, gid, mode)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return ErrNSExists
	}
	return nil
}

// Perm returns the namespace's permissions; ok is false when none is
// recorded. ErrNSNotFound if it is absent.
func (l *Links) Perm(ctx context.Context, name string) (NSPerm, bool, error) {
	var uid, gid, mode sql.NullInt64
	err := l.db.QueryRowContext(ctx, l.q.perm, name).Scan(&uid, &gid, &mode)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return NSPerm{}, false, ErrNSNotFound
	case err != nil:
		return NSPerm{}, false, err
	case !uid.Valid || !gid.Valid || !mode.Valid:
		return NSPerm{}, false, nil
	}
	return NSPerm{Uid: uint32(uid.Int64), Gid: uint32(gid.Int64), Mode: uint32(mode.Int64)}, true, nil
}

// SetPerm records the namespace's permissions. ErrNSNotFound if it is
// absent; blob.ErrReadOnly on an older store that has no place for them.
func (l *Links) SetPerm(ctx context.Context, name string, p NSPerm) error {
	if l.noPerm {
		return blob.ErrReadOnly
	}
	return l.updateNS(ctx, l.q.setPerm, int64(p.Uid), int64(p.Gid), int64(p.Mode), name)
}

// updateNS runs an UPDATE of one namespace's row: ErrNSNotFound when no
// row has its name.
func (l *Links) updateNS(ctx context.Context, query string, args ...any) error {
	res, err := l.db.ExecContext(ctx, query, args...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNSNotFound
	}
	return nil
}

// Remove deletes the namespace if it has no reference and no intent:
// ErrNSNotFound if it is absent, ErrNSNotEmpty if it holds something.
//
// With a close journal (journal_guard.go), it first waits until every
// close any process journaled before it is written, so that a namespace
// a close was acknowledged into is not empty to it.
func (l *Links) Remove(ctx context.Context, name string) error {
	return l.journal().Guard(ctx, true, func() error { return l.remove(ctx, name) })
}

// journal is the database's close journal, nil without one.
func (l *Links) journal() *Journal {
	if l.batch == nil {
		return nil
	}
	return l.batch.journal
}

func (l *Links) remove(ctx context.Context, name string) error {
	res, err := l.db.ExecContext(ctx, l.q.remove, name, name, name)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 1 {
		return nil
	}
	// Say why nothing was deleted.
	ok, cerr := l.exists(ctx, l.db, name)
	switch {
	case cerr != nil:
		return errors.Join(err, cerr)
	case !ok:
		return ErrNSNotFound
	case err == nil:
		return ErrNSNotEmpty
	}
	// The delete failed. On PostgreSQL a foreign-key violation means a
	// concurrent Link or Pend committed first: not empty after all.
	var refs int64
	if qerr := l.db.QueryRowContext(ctx, l.q.count, name).Scan(&refs); qerr == nil && refs > 0 {
		return ErrNSNotEmpty
	}
	if ok, qerr := l.AnyPending(ctx, name); qerr == nil && ok {
		return ErrNSNotEmpty
	}
	return err
}

// NamesPage returns up to n namespace names after `after`, ascending.
func (l *Links) NamesPage(ctx context.Context, after string, n int) ([]string, error) {
	rows, err := l.db.QueryContext(ctx, l.q.names, after, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]string, 0, n)
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// rebindNS is engines.Rebind: the statements here are written once with
// `?`.
func rebindNS(dialect, q string) string { return engines.Rebind(dialect, q) }

// nsKey is the lower bound of a listing that starts after *d, or from the
// start when d is nil: the empty blob, which sorts below every 32-byte key
// in both dialects, so that such a listing includes the zero digest.
func nsKey(d *blob.Digest) []byte {
	if d == nil {
		return []byte{}
	}
	return d[:]
}

// inList is "(?, ?, …)" of n placeholders.
func inList(n int) string { return "(?" + strings.Repeat(", ?", n-1) + ")" }
