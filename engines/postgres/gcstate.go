package postgres

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// The GC host on PostgreSQL (engines.GCHost).
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

const pinsSchema = `CREATE TABLE IF NOT EXISTS gc_pins (
	digest BYTEA NOT NULL,
	owner  TEXT NOT NULL,
	expiry BIGINT NOT NULL,
	PRIMARY KEY (digest, owner)
)`

const nowOnce = `(SELECT ` + engines.PGNow + `)`

const pinsOwnerIndex = `CREATE INDEX IF NOT EXISTS gc_pins_owner ON gc_pins (owner)`

// sweepLeaseKey is the session advisory lock of the sweep lease, in the
// two-int4 key space, which never overlaps the one-bigint space of the
// digest locks and the schema lock ("alks" "weep").
const (
	sweepLeaseClass = 0x616c6b73
	sweepLeaseObj   = 0x77656570
)

// lockKeys returns the advisory keys of ds, ascending and without repeats.
func lockKeys(ds []blob.Digest) []int64 {
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
	lockShared    = `SELECT count(pg_advisory_xact_lock_shared(k)) FROM (SELECT unnest($1::bigint[]) AS k ORDER BY 1) s`
	lockExclusive = `SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT unnest($1::bigint[]) AS k ORDER BY 1) s`
)

func byteas(ds []blob.Digest) [][]byte {
	out := make([][]byte, len(ds))
	for i := range ds {
		out[i] = ds[i][:]
	}
	return out
}

// PinRows implements engines.GCHost.
func (e *Engine) PinRows(ctx context.Context, tx *sql.Tx, owner string, ds []blob.Digest, ttl time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	// One row per digest: ON CONFLICT cannot update a row twice in one
	// statement.
	ds = slices.Clone(ds)
	slices.SortFunc(ds, blob.Digest.Compare)
	ds = slices.Compact(ds)
	run := func(tx *sql.Tx) error {
		var n int64
		if err := tx.QueryRowContext(ctx, lockShared, lockKeys(ds)).Scan(&n); err != nil {
			return e.wrap("pin", err)
		}
		// After the lock: a row that waited for an arbitration counts its
		// TTL from when it commits, not from before the wait.
		_, err := tx.ExecContext(ctx, `INSERT INTO gc_pins (digest, owner, expiry)
			SELECT d, $2, `+nowOnce+` + $3::bigint FROM unnest($1::bytea[]) AS d
			ON CONFLICT (digest, owner) DO UPDATE SET expiry = greatest(gc_pins.expiry, excluded.expiry)`,
			byteas(ds), owner, int64(ttl))
		return e.wrap("pin", err)
	}
	if tx != nil {
		if b := e.puts.batchOf(tx); b != nil {
			// A put's pin row: the batch's own statement writes it,
			// under the same lock and in the same transaction (putGroup).
			for _, d := range ds {
				b.pins = append(b.pins, pinReq{d: d, owner: owner, ttl: ttl})
			}
			return nil
		}
		return run(tx)
	}
	return e.inTx(ctx, "pin", run)
}

// inTx runs fn in a database/sql transaction and commits it.
//
// Design point (transaction termination): catch, terminate, propagate —
// every error path rolls the transaction back before returning, so no
// connection goes back to the pool inside a transaction (a pooled session
// left "idle in transaction" would hold its locks until reused).
func (e *Engine) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	return engines.InTx(ctx, e.db, func(err error) error { return e.wrap(op, err) }, fn)
}

// RenewPins implements engines.GCHost.
func (e *Engine) RenewPins(ctx context.Context, owner string, ttl time.Duration) (map[blob.Digest]bool, error) {
	rows, err := e.pool.Query(ctx, `WITH c AS (SELECT `+engines.PGNow+` AS t)
		UPDATE gc_pins SET expiry = c.t + $1::bigint FROM c WHERE owner = $2 AND expiry > c.t RETURNING digest`,
		int64(ttl), owner)
	if err != nil {
		return nil, e.wrap("renew pins", err)
	}
	defer rows.Close()
	out := make(map[blob.Digest]bool)
	err = engines.ScanDigests(rows, func(d blob.Digest) { out[d] = true })
	return out, e.wrap("renew pins", err)
}

// DropPins implements engines.GCHost.
func (e *Engine) DropPins(ctx context.Context, owner string, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	_, err := e.pool.Exec(ctx, `DELETE FROM gc_pins WHERE owner = $1 AND digest = ANY($2::bytea[])`, owner, byteas(ds))
	return e.wrap("drop pins", err)
}

// DropOwner implements engines.GCHost.
func (e *Engine) DropOwner(ctx context.Context, owner string) error {
	_, err := e.pool.Exec(ctx, `DELETE FROM gc_pins WHERE owner = $1`, owner)
	return e.wrap("drop pins", err)
}

// ReapPins implements engines.GCHost.
func (e *Engine) ReapPins(ctx context.Context) (int64, error) {
	tag, err := e.pool.Exec(ctx, `DELETE FROM gc_pins WHERE expiry <= `+nowOnce)
	if err != nil {
		return 0, e.wrap("reap pins", err)
	}
	return tag.RowsAffected(), nil
}

// PinCount implements engines.GCHost.
func (e *Engine) PinCount(ctx context.Context) (int64, error) {
	var n int64
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM gc_pins WHERE expiry > `+nowOnce).Scan(&n)
	return n, e.wrap("count pins", err)
}

// Arbitrate implements engines.GCHost.
func (e *Engine) Arbitrate(ctx context.Context, ds []blob.Digest, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return e.inTx(ctx, "arbitrate", func(tx *sql.Tx) error {
		var n int64
		if err := tx.QueryRowContext(ctx, lockExclusive, lockKeys(ds)).Scan(&n); err != nil {
			return e.wrap("arbitrate", err)
		}
		return fn(ctx, tx)
	})
}

// PinnedAmong implements engines.GCHost.
func (e *Engine) PinnedAmong(ctx context.Context, tx *sql.Tx, ds []blob.Digest, except string) (map[blob.Digest]bool, error) {
	out := make(map[blob.Digest]bool)
	if len(ds) == 0 {
		return out, nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT DISTINCT digest FROM gc_pins
		WHERE digest = ANY($1::bytea[]) AND expiry > `+nowOnce+` AND owner <> $2`, byteas(ds), except)
	if err != nil {
		return nil, e.wrap("pinned", err)
	}
	defer rows.Close()
	err = engines.ScanDigests(rows, func(d blob.Digest) { out[d] = true })
	return out, e.wrap("pinned", err)
}

// DeleteManyTx implements engines.GCHost: one DELETE … RETURNING.
func (e *Engine) DeleteManyTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) ([]int64, error) {
	sizes := make([]int64, len(ds))
	for i := range sizes {
		sizes[i] = -1
	}
	if len(ds) == 0 {
		return sizes, nil
	}
	rows, err := tx.QueryContext(ctx, `DELETE FROM blobs WHERE digest = ANY($1::bytea[]) RETURNING digest, size`, byteas(ds))
	if err != nil {
		return nil, e.wrap("delete", err)
	}
	defer rows.Close()
	got := make(map[blob.Digest]int64, len(ds))
	if err := engines.ScanSizes(rows, func(d blob.Digest, n int64) { got[d] = n }); err != nil {
		return nil, e.wrap("delete", err)
	}
	gone := make([][]byte, 0, len(got))
	for i, d := range ds {
		if n, ok := got[d]; ok {
			sizes[i] = n
			gone = append(gone, d[:])
			delete(got, d) // a repeated digest was deleted once
		}
	}
	// A deleted blob leaves the delete window with its row, in the same
	// transaction: a sweeper killed after the commit, before it clears
	// the window (WindowRemove), leaves no candidate that the next sweep
	// would find vanished and count as cancelled, when it was deleted.
	if len(gone) > 0 {
		if _, err := tx.ExecContext(ctx, `DELETE FROM gc_window WHERE digest = ANY($1::bytea[])`, gone); err != nil {
			return nil, e.wrap("delete", err)
		}
	}
	return sizes, nil
}

// SweepLease implements engines.GCHost with a session advisory lock held on
// a connection of its own, outside the pool: a sweep runs for as long as it
// runs, and must not hold one of the connections that pins, puts and
// lookups wait for (with pool_max_conns=1 its ReapPins waited forever for
// the lease's own). The server drops the lock when the holder dies, and
// also when the server restarts: Check notices that (the connection is
// gone, or the lock is no longer granted to it).
func (e *Engine) SweepLease(ctx context.Context) (engines.Lease, bool, error) {
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, false, e.wrap("sweep lease", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(sweepLeaseClass), int32(sweepLeaseObj)).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, false, e.wrap("sweep lease", err)
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx))
		return nil, false, nil
	}
	return &pgLease{conn: conn, name: e.name}, true, nil
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

// Instance implements engines.Locator: host:port/database.
func (e *Engine) Instance() string { return e.srv.Addr() + "/" + e.srv.Database }

// PoolSize implements engines.Locator.
func (e *Engine) PoolSize() int { return int(e.pool.Config().MaxConns) }
