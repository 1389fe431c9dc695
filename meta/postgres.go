package meta

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Postgres is the shared state in a PostgreSQL database (the postgres kv
// engine's): pins, arbitration and the sweep lease (Host), the delete
// window (PGWindow) and the corrupt ledger. Every host of a fleet reads
// the same rows.
//
// The arbitration lock is a transaction-scoped advisory lock per digest,
// keyed by the digest's first eight bytes (a collision only serializes two
// digests needlessly). Arbitrate takes it exclusive, PinRows shared; both
// take their keys in ascending order, so two of them never deadlock. Under
// READ COMMITTED every statement reads a fresh snapshot, so the reads that
// follow the lock see every pin row committed before it was granted.
//
// Expiries are the server's clock (engines.PGNow) plus the TTL, computed
// and compared in the statements: the hosts of a fleet never compare their
// own clocks with each other's rows. nowOnce reads the clock once per
// statement (an uncorrelated subquery is evaluated once), so every row of
// a renewal or a reap is judged at one instant.
type Postgres struct {
	*PGWindow
	pool  *pgxpool.Pool
	db    *sql.DB
	name  string
	wrapD Wrap
	// blobDel is PostgresConfig.BlobDelete with the window rows' CTE:
	// deleteBlobsTx's statement.
	blobDel string
}

var (
	_ Host   = (*Postgres)(nil)
	_ Window = (*Postgres)(nil)
	_ Ledger = (*Postgres)(nil)
)

// PostgresConfig is what OpenPostgres needs of the engine that opened the
// database.
type PostgresConfig struct {
	// Name is the engine's name, for messages.
	Name string
	// Pool is the engine's pool; DB a database/sql handle over it, for
	// this state's transactions of several statements (Arbitrate,
	// PinRows).
	Pool *pgxpool.Pool
	DB   *sql.DB
	// Wrap names the engine on errors (nil: blob.Wrap with Name).
	Wrap Wrap
	// BlobDelete is the engine's statement that deletes the blob rows of
	// the digests $1 (a bytea[]) and returns each deleted row's digest
	// and size: what Arbitrate deletes the dead with, in its transaction,
	// as the CTE d of one statement that also takes their window rows
	// (PGWindowGone). Required: every database with this state keeps the
	// engine's blobs (a large engine's, pglo, keeps only a PGWindow).
	BlobDelete string
}

const pgPinsSchema = `CREATE TABLE IF NOT EXISTS gc_pins (
	digest BYTEA NOT NULL,
	owner  TEXT NOT NULL,
	expiry BIGINT NOT NULL,
	PRIMARY KEY (digest, owner)
)`

const pgPinsOwnerIndex = `CREATE INDEX IF NOT EXISTS gc_pins_owner ON gc_pins (owner)`

// The corrupt ledger; marked is the server's clock.
const pgCorruptSchema = `CREATE TABLE IF NOT EXISTS gc_corrupt (
	digest BYTEA PRIMARY KEY,
	file   BYTEA NOT NULL,
	reason TEXT NOT NULL,
	marked BIGINT NOT NULL
)`

const pgWindowSchema = `CREATE TABLE IF NOT EXISTS gc_window (
	digest        BYTEA PRIMARY KEY,
	visible_after BIGINT NOT NULL
)`

const nowOnce = `(SELECT ` + engines.PGNow + `)`

// OpenPostgres creates the state's tables in the database if needed.
func OpenPostgres(ctx context.Context, cfg PostgresConfig) (*Postgres, error) {
	p := &Postgres{pool: cfg.Pool, db: cfg.DB, name: cfg.Name, wrapD: cfg.Wrap}
	if p.wrapD == nil {
		p.wrapD = func(op string, d blob.Digest, err error) error { return blob.Wrap(op, cfg.Name, d, err) }
	}
	if cfg.BlobDelete == "" {
		return nil, p.wrap("open", errNoBlobDelete)
	}
	p.blobDel = `WITH d AS (` + cfg.BlobDelete + `), ` + PGWindowGone("d") + ` SELECT digest, size FROM d`
	if err := CreatePGSchema(ctx, cfg.Pool, pgPinsSchema, pgPinsOwnerIndex, pgCorruptSchema, pgWindowSchema); err != nil {
		return nil, p.wrap("open", err)
	}
	p.PGWindow = &PGWindow{pool: cfg.Pool, name: cfg.Name, wrapD: p.wrapD}
	return p, nil
}

// Meta is the state as a State: every part.
func (p *Postgres) Meta() State { return State{Host: p, Window: p, Ledger: p} }

func (p *Postgres) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return p.wrapD(op, blob.Digest{}, err)
}

// CreatePGSchema runs ddl in one transaction under the schema lock
// (engines.PGSchemaLock), so that processes opening the same database at
// once do not trip over each other, unless every table and index it makes
// exists already: then it runs nothing, and takes no lock that a writer of
// those tables holds (see engines.DDLRelations). It is how every table of
// a pool's PostgreSQL database is made: the shared state's here, the
// engines' blob tables through postgres.CreateSchema.
func CreatePGSchema(ctx context.Context, pool *pgxpool.Pool, ddl ...string) error {
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

// sweepLeaseKey is the session advisory lock of the sweep lease, in the
// two-int4 key space, which never overlaps the one-bigint space of the
// digest locks and the schema lock ("alks" "weep").
const (
	sweepLeaseClass = 0x616c6b73
	sweepLeaseObj   = 0x77656570
)

// PGLockKeys returns the advisory keys of the arbitration lock of ds,
// ascending and without repeats: the argument of PGLockShared.
func PGLockKeys(ds []blob.Digest) []int64 {
	ks := make([]int64, len(ds))
	for i, d := range ds {
		ks[i] = int64(binary.BigEndian.Uint64(d[:8]))
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

// The ORDER BY sits in a subquery so that the locks are taken in key order
// (a volatile function in the outer target list runs row by row as the
// sorted subquery yields).
const (
	// PGLockShared takes the shared arbitration lock of the keys $1
	// (PGLockKeys), in key order: what a pin row waits on. A put batch's
	// statement embeds it as its first CTE, l, so that no row it inserts
	// goes in before every lock is granted.
	PGLockShared  = `SELECT count(pg_advisory_xact_lock_shared(k)) FROM (SELECT unnest($1::bigint[]) AS k ORDER BY 1) s`
	lockExclusive = `SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT unnest($1::bigint[]) AS k ORDER BY 1) s`
)

// PGBatchPins is the CTE p of a put batch's statement: the batch's pin
// rows, from the arrays $2 (digests), $3 (owners) and $4 (TTLs in
// nanoseconds) that PGPinArgs makes, joined with the lock CTE l
// (PGLockShared) so that they go in once every lock is granted, expiring
// each TTL after the server's clock. The statement must begin
// `WITH l AS (` + PGLockShared + `), ` + PGBatchPins.
const PGBatchPins = `p AS (INSERT INTO gc_pins (digest, owner, expiry)
		SELECT u.d, u.o, ` + nowOnce + ` + u.t FROM l, unnest($2::bytea[], $3::text[], $4::bigint[]) AS u(d, o, t)
		ON CONFLICT (digest, owner) DO UPDATE SET expiry = greatest(gc_pins.expiry, excluded.expiry))`

// PGWindowGone returns the CTE w that deletes the window rows of the
// digests the CTE named cte returns (a DELETE … RETURNING digest of the
// blobs): a deleted blob leaves the delete window with its row, in the
// same statement, so that a sweeper killed after the commit, before it
// clears the window (WindowRemove), leaves no candidate that the next
// sweep would find vanished and count as cancelled, when it was deleted.
func PGWindowGone(cte string) string {
	return `w AS (DELETE FROM gc_window WHERE digest IN (SELECT digest FROM ` + cte + `))`
}

// PinRow is the pin row of a put (Rows.Pin): D held by Owner until TTL
// after the row clock's now when it commits. An engine writes it in the
// put's transaction (SQLite's WriteRows), or in its
// batch statement (PGBatchPins).
type PinRow struct {
	D     blob.Digest
	Owner string
	TTL   time.Duration
}

// PGPinArgs returns the arrays $2-$4 of PGBatchPins for rows: one row per
// (digest, owner), with the longest TTL asked (ON CONFLICT cannot update a
// row twice in one statement), in digest order. It sorts rows.
func PGPinArgs(rows []PinRow) (ds [][]byte, owners []string, ttls []int64) {
	slices.SortFunc(rows, func(a, b PinRow) int {
		if c := a.D.Compare(b.D); c != 0 {
			return c
		}
		return strings.Compare(a.Owner, b.Owner)
	})
	for i, r := range rows {
		if i > 0 && r.D == rows[i-1].D && r.Owner == rows[i-1].Owner {
			ttls[len(ttls)-1] = max(ttls[len(ttls)-1], int64(r.TTL))
			continue
		}
		ds, owners, ttls = append(ds, r.D[:]), append(owners, r.Owner), append(ttls, int64(r.TTL))
	}
	return ds, owners, ttls
}

func byteas(ds []blob.Digest) [][]byte {
	out := make([][]byte, len(ds))
	for i := range ds {
		out[i] = ds[i][:]
	}
	return out
}

// PinRows implements Host.
func (p *Postgres) PinRows(ctx context.Context, owner string, ds []blob.Digest, ttl time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	// One row per digest: ON CONFLICT cannot update a row twice in one
	// statement.
	ds = slices.Clone(ds)
	slices.SortFunc(ds, blob.Digest.Compare)
	ds = slices.Compact(ds)
	return InTx(ctx, p.db, func(err error) error { return p.wrap("pin", err) }, func(tx *sql.Tx) error {
		var n int64
		if err := tx.QueryRowContext(ctx, PGLockShared, PGLockKeys(ds)).Scan(&n); err != nil {
			return p.wrap("pin", err)
		}
		// After the lock: a row that waited for an arbitration counts its
		// TTL from when it commits, not from before the wait.
		_, err := tx.ExecContext(ctx, `INSERT INTO gc_pins (digest, owner, expiry)
			SELECT d, $2, `+nowOnce+` + $3::bigint FROM unnest($1::bytea[]) AS d
			ON CONFLICT (digest, owner) DO UPDATE SET expiry = greatest(gc_pins.expiry, excluded.expiry)`,
			byteas(ds), owner, int64(ttl))
		return p.wrap("pin", err)
	})
}

// RenewPins implements Host.
func (p *Postgres) RenewPins(ctx context.Context, owner string, ttl time.Duration) (map[blob.Digest]bool, error) {
	rows, err := p.pool.Query(ctx, `WITH c AS (SELECT `+engines.PGNow+` AS t)
		UPDATE gc_pins SET expiry = c.t + $1::bigint FROM c WHERE owner = $2 AND expiry > c.t RETURNING digest`,
		int64(ttl), owner)
	if err != nil {
		return nil, p.wrap("renew pins", err)
	}
	defer rows.Close()
	out := make(map[blob.Digest]bool)
	err = engines.ScanDigests(rows, func(d blob.Digest) { out[d] = true })
	return out, p.wrap("renew pins", err)
}

// DropPins implements Host.
func (p *Postgres) DropPins(ctx context.Context, owner string, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	_, err := p.pool.Exec(ctx, `DELETE FROM gc_pins WHERE owner = $1 AND digest = ANY($2::bytea[])`, owner, byteas(ds))
	return p.wrap("drop pins", err)
}

// DropOwner implements Host.
func (p *Postgres) DropOwner(ctx context.Context, owner string) error {
	_, err := p.pool.Exec(ctx, `DELETE FROM gc_pins WHERE owner = $1`, owner)
	return p.wrap("drop pins", err)
}

// ReapPins implements Host.
func (p *Postgres) ReapPins(ctx context.Context) (int64, error) {
	tag, err := p.pool.Exec(ctx, `DELETE FROM gc_pins WHERE expiry <= `+nowOnce)
	if err != nil {
		return 0, p.wrap("reap pins", err)
	}
	return tag.RowsAffected(), nil
}

// PinCount implements Host.
func (p *Postgres) PinCount(ctx context.Context) (int64, error) {
	var n int64
	err := p.pool.QueryRow(ctx, `SELECT count(*) FROM gc_pins WHERE expiry > `+nowOnce).Scan(&n)
	return n, p.wrap("count pins", err)
}

// Arbitrate implements Host: the exclusive advisory lock of every
// digest, in key order, then arbitrateIn, in one transaction. PostgreSQL
// never runs a transaction again, so both forms run the same way, once.
//
// Design point (transaction termination): catch, terminate, propagate —
// every error path rolls the transaction back before returning, so no
// connection goes back to the pool inside a transaction (a pooled session
// left "idle in transaction" would hold its locks until reused).
func (p *Postgres) Arbitrate(ctx context.Context, a Arbitration) ([]int64, error) {
	var out []int64
	err := InTx(ctx, p.db, func(err error) error { return p.wrap("arbitrate", err) }, func(tx *sql.Tx) error {
		var n int64
		if err := tx.QueryRowContext(ctx, lockExclusive, PGLockKeys(a.Digests)).Scan(&n); err != nil {
			return p.wrap("arbitrate", err)
		}
		var err error
		out, err = arbitrateIn(ctx, tx, p, a)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// pinnedTx implements arbitrator: the digests of ds with a row of any
// owner unexpired on the server's clock, read in tx.
func (p *Postgres) pinnedTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error) {
	out := make(map[blob.Digest]bool)
	rows, err := tx.QueryContext(ctx, `SELECT DISTINCT digest FROM gc_pins
		WHERE digest = ANY($1::bytea[]) AND expiry > `+nowOnce, byteas(ds))
	if err != nil {
		return nil, p.wrap("pinned", err)
	}
	defer rows.Close()
	err = engines.ScanDigests(rows, func(d blob.Digest) { out[d] = true })
	return out, p.wrap("pinned", err)
}

// DeleteBlobs deletes the kv rows of ds and their window rows with the
// arbitration's statement, outside any arbitration, in a transaction of
// its own, and returns each one's size or NotHeld: the engine's
// engines.BatchDeleter, so that the statement is built in one place.
func (p *Postgres) DeleteBlobs(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	if len(ds) == 0 {
		return []int64{}, nil
	}
	var sizes []int64
	err := InTx(ctx, p.db, func(err error) error { return p.wrap("delete", err) }, func(tx *sql.Tx) error {
		var err error
		sizes, err = p.deleteBlobsTx(ctx, tx, ds)
		return err
	})
	if err != nil {
		return nil, err
	}
	return sizes, nil
}

// deleteBlobsTx implements arbitrator: one statement, the engine's
// BlobDelete and the window rows of what it deleted (PGWindowGone).
func (p *Postgres) deleteBlobsTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) ([]int64, error) {
	sizes := make([]int64, len(ds))
	for i := range sizes {
		sizes[i] = NotHeld
	}
	rows, err := tx.QueryContext(ctx, p.blobDel, byteas(ds))
	if err != nil {
		return nil, p.wrap("delete", err)
	}
	defer rows.Close()
	got := make(map[blob.Digest]int64, len(ds))
	if err := engines.ScanSizes(rows, func(d blob.Digest, n int64) { got[d] = n }); err != nil {
		return nil, p.wrap("delete", err)
	}
	for i, d := range ds {
		if n, ok := got[d]; ok {
			sizes[i] = n
			delete(got, d) // a repeated digest was deleted once
		}
	}
	return sizes, nil
}

// SweepLease implements Host with a session advisory lock held on a
// connection of its own, outside the pool: a sweep runs for as long as it
// runs, and must not hold one of the connections that pins, puts and
// lookups wait for (with pool_max_conns=1 its ReapPins waited forever for
// the lease's own). The server drops the lock when the holder dies, and
// also when the server restarts: Check notices that (the connection is
// gone, or the lock is no longer granted to it).
func (p *Postgres) SweepLease(ctx context.Context) (Lease, bool, error) {
	conn, err := pgx.ConnectConfig(ctx, p.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, false, p.wrap("sweep lease", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(sweepLeaseClass), int32(sweepLeaseObj)).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, false, p.wrap("sweep lease", err)
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx))
		return nil, false, nil
	}
	return &pgLease{conn: conn, name: p.name}, true, nil
}

type pgLease struct {
	mu   sync.Mutex
	conn *pgx.Conn
	name string
}

func (l *pgLease) Check(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return fmt.Errorf("sweep lease on %s: released", l.name)
	}
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
		AND pid = pg_backend_pid() AND granted AND classid = $1 AND objid = $2 AND objsubid = 2)`,
		uint32(sweepLeaseClass), uint32(sweepLeaseObj)).Scan(&held)
	switch {
	case err != nil:
		return fmt.Errorf("sweep lease on %s lost: %w", l.name, err)
	case !held:
		return fmt.Errorf("sweep lease on %s lost: the server no longer holds it for this session", l.name)
	}
	return nil
}

// Release unlocks, then ends the lease's session. Closing alone would drop
// the lock too, but only once the server's backend has gone, a moment
// after the close returns: a sweep right after this one, on this host or
// another, would find the pool still being swept.
func (l *pgLease) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, int32(sweepLeaseClass), int32(sweepLeaseObj))
	l.conn.Close(ctx)
	l.conn = nil
}

// MarkCorrupt implements Ledger.
func (p *Postgres) MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error {
	_, err := p.pool.Exec(ctx, `INSERT INTO gc_corrupt (digest, file, reason, marked) VALUES ($1, $2, $3, `+engines.PGNow+`)
		ON CONFLICT (digest) DO UPDATE SET file = excluded.file, reason = excluded.reason, marked = excluded.marked`,
		d[:], nonNil(file), reason)
	if err != nil {
		return p.wrapD("mark corrupt", d, err)
	}
	return nil
}

// CorruptMark implements Ledger.
func (p *Postgres) CorruptMark(ctx context.Context, d blob.Digest) (Mark, bool, error) {
	m := Mark{Digest: d}
	var marked int64
	err := p.pool.QueryRow(ctx, `SELECT file, reason, marked FROM gc_corrupt WHERE digest = $1`, d[:]).Scan(&m.File, &m.Reason, &marked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Mark{}, false, nil
	case err != nil:
		return Mark{}, false, p.wrapD("corrupt mark", d, err)
	}
	m.Marked = time.Unix(0, marked)
	return m, true, nil
}

// ClearCorrupt implements Ledger.
func (p *Postgres) ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error) {
	tag, err := p.pool.Exec(ctx, `DELETE FROM gc_corrupt WHERE digest = $1 AND file = $2`, d[:], nonNil(file))
	if err != nil {
		return false, p.wrapD("clear corrupt", d, err)
	}
	return tag.RowsAffected() > 0, nil
}

// CorruptMarks implements Ledger.
func (p *Postgres) CorruptMarks(ctx context.Context) ([]Mark, error) {
	rows, err := p.pool.Query(ctx, corruptMarksSQL)
	if err != nil {
		return nil, p.wrap("corrupt marks", err)
	}
	defer rows.Close()
	marks, err := scanMarks(rows)
	return marks, p.wrap("corrupt marks", err)
}

// PGWindow is the GC's durable delete window in a PostgreSQL database's
// gc_window table:
//
//	gc_window(digest BYTEA PRIMARY KEY, visible_after BIGINT NOT NULL)
//
// visible_after is unix nanoseconds on the server's clock (engines.PGNow):
// a row queued by one host is due at the same moment for every host,
// whatever their own clocks say. Both PostgreSQL engines keep one (the
// table is shared when they share a database); the store uses one window
// per instance, so with kv=postgres the pglo engine's stays dormant.
type PGWindow struct {
	pool  *pgxpool.Pool
	name  string
	wrapD Wrap
}

var _ Window = (*PGWindow)(nil)

// OpenPGWindow creates gc_window in pool's database if needed: the window
// of a large engine there (pglo). name is the engine name errors carry.
func OpenPGWindow(ctx context.Context, pool *pgxpool.Pool, name string) (*PGWindow, error) {
	if err := CreatePGSchema(ctx, pool, pgWindowSchema); err != nil {
		return nil, blob.Wrap("open", name, blob.Digest{}, err)
	}
	return &PGWindow{pool: pool, name: name, wrapD: func(op string, d blob.Digest, err error) error {
		return blob.Wrap(op, name, d, err)
	}}, nil
}

// Meta is the window as a State: a large engine's database keeps no other
// part.
func (w *PGWindow) Meta() State { return State{Window: w} }

// WindowQueue implements Window in one statement. A digest already
// queued keeps its row (and its time).
func (w *PGWindow) WindowQueue(ctx context.Context, ds []blob.Digest, delay time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	_, err := w.pool.Exec(ctx, `INSERT INTO gc_window (digest, visible_after)
		SELECT d, `+nowOnce+` + $2::bigint FROM unnest($1::bytea[]) AS d ON CONFLICT (digest) DO NOTHING`,
		byteas(ds), int64(max(delay, 0)))
	return w.wrap("window queue", err)
}

// WindowDue implements Window.
func (w *PGWindow) WindowDue(ctx context.Context, after blob.Digest, limit int) ([]blob.Digest, error) {
	if limit <= 0 {
		return nil, nil
	}
	// The zero cursor binds as the empty bytea, which sorts below every
	// 32-byte key: it lists from the start, the zero digest included.
	cur := []byte{}
	if !after.IsZero() {
		cur = after[:]
	}
	rows, err := w.pool.Query(ctx, `SELECT digest FROM gc_window
		WHERE digest > $1 AND visible_after <= `+nowOnce+` ORDER BY digest LIMIT $2`, cur, limit)
	if err != nil {
		return nil, w.wrap("window due", err)
	}
	defer rows.Close()
	var ds []blob.Digest
	if err := engines.ScanDigests(rows, func(d blob.Digest) { ds = append(ds, d) }); err != nil {
		return nil, w.wrap("window due", err)
	}
	return ds, nil
}

// WindowRemove implements Window; absent digests are ignored.
func (w *PGWindow) WindowRemove(ctx context.Context, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	_, err := w.pool.Exec(ctx, `DELETE FROM gc_window WHERE digest = ANY($1::bytea[])`, byteas(ds))
	return w.wrap("window remove", err)
}

// WindowLen implements Window.
func (w *PGWindow) WindowLen(ctx context.Context) (int, error) {
	var n int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM gc_window`).Scan(&n); err != nil {
		return 0, w.wrap("window len", err)
	}
	return n, nil
}

func (w *PGWindow) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return w.wrapD(op, blob.Digest{}, err)
}
