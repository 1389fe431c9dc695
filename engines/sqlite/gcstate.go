package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// The GC host on SQLite (engines.GCHost). Its arbitration lock is the
// database's write lock: every transaction of this engine begins IMMEDIATE
// (_txlock=immediate), so Arbitrate's transaction excludes every writer of
// every process for its whole length — pin rows, links, puts alike — and
// PinRows needs no lock of its own.
//
// Expiries are the row clock (clock.go) plus the TTL, read inside the
// write transaction, after the lock is held: a row that waited for an
// arbitration counts its TTL from when it commits, and an arbitration
// judges rows at the moment it excludes every writer.

// SerialArbitration implements engines.SerialHost: Arbitrate's lock is
// the database's write lock, which every write transaction holds from its
// BEGIN IMMEDIATE to its end.
func (e *Engine) SerialArbitration() bool { return true }

// PinRows implements engines.GCHost.
func (e *Engine) PinRows(ctx context.Context, tx *sql.Tx, owner string, ds []blob.Digest, ttl time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	run := func(ctx context.Context, tx *sql.Tx) error {
		st := tx.StmtContext(ctx, e.pinUp)
		expiry := engines.AddNanos(e.clock.now(), ttl)
		for _, d := range ds {
			if _, err := st.ExecContext(ctx, d[:], owner, expiry); err != nil {
				return e.wrapD("pin", d, err)
			}
		}
		return nil
	}
	if tx != nil {
		return run(ctx, tx)
	}
	return e.inTx(ctx, "pin", run)
}

// RenewPins implements engines.GCHost.
func (e *Engine) RenewPins(ctx context.Context, owner string, ttl time.Duration) (map[blob.Digest]bool, error) {
	var out map[blob.Digest]bool
	err := e.inTx(ctx, "renew pins", func(ctx context.Context, tx *sql.Tx) error {
		out = make(map[blob.Digest]bool) // afresh: a job may run twice
		now := e.clock.now()
		if err := e.scanDigests(ctx, tx, `UPDATE gc_pins SET expiry = ? WHERE owner = ? AND expiry > ? RETURNING digest`,
			[]any{engines.AddNanos(now, ttl), owner, now}, out); err != nil {
			return e.wrap("renew pins", err)
		}
		return nil
	})
	return out, err
}

// DropPins implements engines.GCHost.
func (e *Engine) DropPins(ctx context.Context, owner string, ds []blob.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	return e.inTx(ctx, "drop pins", func(ctx context.Context, tx *sql.Tx) error {
		st := tx.StmtContext(ctx, e.pinDel)
		for _, d := range ds {
			if _, err := st.ExecContext(ctx, d[:], owner); err != nil {
				return blob.Wrap("drop pins", e.name, d, err)
			}
		}
		return nil
	})
}

// DropOwner implements engines.GCHost.
func (e *Engine) DropOwner(ctx context.Context, owner string) error {
	_, err := e.db.ExecContext(ctx, `DELETE FROM gc_pins WHERE owner = ?`, owner)
	return e.wrap("drop pins", err)
}

// ReapPins implements engines.GCHost.
func (e *Engine) ReapPins(ctx context.Context) (int64, error) {
	res, err := e.db.ExecContext(ctx, `DELETE FROM gc_pins WHERE expiry <= ?`, e.clock.now())
	if err != nil {
		return 0, e.wrap("reap pins", err)
	}
	n, err := res.RowsAffected()
	return n, e.wrap("reap pins", err)
}

// PinCount implements engines.GCHost.
func (e *Engine) PinCount(ctx context.Context) (int64, error) {
	var n int64
	err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM gc_pins WHERE expiry > ?`, e.clock.now()).Scan(&n)
	return n, e.wrap("count pins", err)
}

// Arbitrate implements engines.GCHost: the transaction begins IMMEDIATE,
// which is the write lock of the whole database.
func (e *Engine) Arbitrate(ctx context.Context, ds []blob.Digest, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return e.inTx(ctx, "arbitrate", fn)
}

// PinnedAmong implements engines.GCHost with IN-list queries on the
// primary key, sizeManyBatch digests at a time: a sweep asks for
// arbitrateBatch candidates at once, and one query per digest was a sixth
// of a million-entry sweep's delete pass.
func (e *Engine) PinnedAmong(ctx context.Context, tx *sql.Tx, ds []blob.Digest, except string) (map[blob.Digest]bool, error) {
	out := make(map[blob.Digest]bool)
	now := e.clock.now() // one instant for every batch
	for lo := 0; lo < len(ds); lo += sizeManyBatch {
		batch := ds[lo:min(len(ds), lo+sizeManyBatch)]
		args := make([]any, 0, len(batch)+2)
		for _, d := range batch {
			args = append(args, d[:])
		}
		args = append(args, now, except)
		q := "SELECT DISTINCT digest FROM gc_pins WHERE digest IN (?" + strings.Repeat(", ?", len(batch)-1) + ") AND expiry > ? AND owner <> ?"
		if err := e.scanDigests(ctx, tx, q, args, out); err != nil {
			return nil, blob.Wrap("pinned", e.name, blob.Digest{}, err)
		}
	}
	return out, nil
}

// scanDigests runs q in tx and adds every digest it returns to out.
func (e *Engine) scanDigests(ctx context.Context, tx *sql.Tx, q string, args []any, out map[blob.Digest]bool) error {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return engines.ScanDigests(rows, func(d blob.Digest) { out[d] = true })
}

// SweepLease implements engines.GCHost with an flock(2) on a file beside
// the database, DB.gc-lease: SQLite stores are on one host, and the kernel
// drops the lock when its holder dies, kill -9 included. The file holds the
// holder's pid, for the message another process prints.
func (e *Engine) SweepLease(ctx context.Context) (engines.Lease, bool, error) {
	path := e.path + ".gc-lease"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, e.wrap("sweep lease", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, e.wrap("sweep lease", fmt.Errorf("flock %s: %w", path, err))
	}
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return &fileLease{f: f}, true, nil
}

// fileLease is a held flock. It cannot be lost while the descriptor is
// open.
type fileLease struct{ f *os.File }

func (l *fileLease) Check(context.Context) error { return nil }

func (l *fileLease) Release() {
	if l.f != nil {
		l.f.Close() // closing the descriptor drops the flock
		l.f = nil
	}
}

// Instance implements engines.Locator for messages: the database file.
func (e *Engine) Instance() string { return e.path }

// PoolSize implements engines.Locator.
func (e *Engine) PoolSize() int { return e.db.Stats().MaxOpenConnections }
