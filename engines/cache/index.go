package cache

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// index is the host's record of the cache, index.db in the cache
// directory, shared by every process that opens the directory: one row per
// published blob (its size and last access), and the counters summed over
// the processes. SQLite in WAL mode serializes the writers across
// processes; each statement is short.
type index struct {
	db *sql.DB

	touchWrites atomic.Int64 // rows touch has updated (tests)
}

var indexSchema = []string{
	`CREATE TABLE IF NOT EXISTS blobs (digest BLOB PRIMARY KEY, size INTEGER NOT NULL, atime INTEGER NOT NULL) WITHOUT ROWID`,
	`CREATE INDEX IF NOT EXISTS blobs_atime ON blobs (atime)`,
	`CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID`,
	// The sizes the remote tier gave (Engine.Size, and each copy's at its
	// publish): a blob's size never changes.
	`CREATE TABLE IF NOT EXISTS sizes (digest BLOB PRIMARY KEY, size INTEGER NOT NULL) WITHOUT ROWID`,
}

func openIndex(ctx context.Context, dir string) (*index, error) {
	path := filepath.Join(dir, "index.db")
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	for _, q := range indexSchema {
		if _, err := db.ExecContext(ctx, q); err != nil {
			db.Close()
			return nil, fmt.Errorf("cache index %s: %w", path, err)
		}
	}
	return &index{db: db}, nil
}

func now() int64 { return time.Now().UnixNano() }

// add records a published copy of d, whose size the remote tier gave: in
// blobs, and in sizes too, which no reconcile rewrites from the files, so
// that a copy truncated or replaced since is told by its size (openHit).
func (x *index) add(ctx context.Context, d blob.Digest, size int64) error {
	return meta.InTx(ctx, x.db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO blobs (digest, size, atime) VALUES (?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET size = excluded.size, atime = excluded.atime`, d[:], size, now()); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO sizes (digest, size) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING`, d[:], size)
		return err
	})
}

// knownSize is the size the remote tier gave for d (its Size, or a fill
// or write-through of d); ok false if none.
func (x *index) knownSize(ctx context.Context, d blob.Digest) (int64, bool) {
	var n int64
	if err := x.db.QueryRowContext(ctx, `SELECT size FROM sizes WHERE digest = ?`, d[:]).Scan(&n); err != nil {
		return 0, false
	}
	return n, true
}

// learnSizes records sizes the remote tier gave.
func (x *index) learnSizes(ctx context.Context, es []engines.Entry) error {
	if len(es) == 0 {
		return nil
	}
	return meta.InTx(ctx, x.db, nil, func(tx *sql.Tx) error {
		for _, e := range es {
			if _, err := tx.ExecContext(ctx, `INSERT INTO sizes (digest, size) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING`, e.Digest[:], e.Size); err != nil {
				return err
			}
		}
		return nil
	})
}

func (x *index) forgetSize(ctx context.Context, d blob.Digest) error {
	_, err := x.db.ExecContext(ctx, `DELETE FROM sizes WHERE digest = ?`, d[:])
	return err
}

func (x *index) remove(ctx context.Context, d blob.Digest) error {
	_, err := x.db.ExecContext(ctx, `DELETE FROM blobs WHERE digest = ?`, d[:])
	return err
}

// touchDiv: an access is written only if the row's recorded one is older
// than 1/touchDiv of the cache's horizon (the age of its oldest copy).
const touchDiv = 8

// touch records the accesses of this process since the last call (digest
// to the time of its last open), in one transaction: a row is updated
// only when its recorded access is older than 1/touchDiv of the horizon
// before the new one, so a copy opened over and over costs a write per
// eighth of the horizon, and the oldest copy, once opened, always moves
// (see Bound and policy in the package doc).
func (x *index) touch(ctx context.Context, at map[blob.Digest]int64) error {
	if len(at) == 0 {
		return nil
	}
	var oldest sql.NullInt64
	if err := x.db.QueryRowContext(ctx, `SELECT MIN(atime) FROM blobs`).Scan(&oldest); err != nil || !oldest.Valid {
		return err
	}
	var wrote int64
	err := meta.InTx(ctx, x.db, nil, func(tx *sql.Tx) error {
		wrote = 0
		for d, t := range at {
			res, err := tx.ExecContext(ctx, `UPDATE blobs SET atime = ? WHERE digest = ? AND atime < ?`,
				t, d[:], t-max(t-oldest.Int64, 0)/touchDiv)
			if err != nil {
				return err
			}
			n, _ := res.RowsAffected()
			wrote += n
		}
		return nil
	})
	if err == nil {
		x.touchWrites.Add(wrote)
	}
	return err
}

// usage is the bytes and blobs the index holds.
func (x *index) usage(ctx context.Context) (bytes, blobs int64, err error) {
	err = x.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(size), 0), COUNT(*) FROM blobs`).Scan(&bytes, &blobs)
	return bytes, blobs, err
}

// oldest lists up to n blobs, least recently accessed first, skipping
// the first skip of them.
func (x *index) oldest(ctx context.Context, skip, n int) ([]engines.Entry, error) {
	rows, err := x.db.QueryContext(ctx, `SELECT digest, size FROM blobs ORDER BY atime, digest LIMIT ? OFFSET ?`, n, skip)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []engines.Entry
	err = engines.ScanSizes(rows, func(d blob.Digest, n int64) { out = append(out, engines.Entry{Digest: d, Size: n}) })
	return out, err
}

// addCounters adds c to the host's counters.
func (x *index) addCounters(ctx context.Context, c engines.CacheCounters) error {
	vals := map[string]int64{"hits": c.Hits, "misses": c.Misses, "fills": c.Fills, "bytes_filled": c.BytesFilled,
		"evictions": c.Evictions, "dropped": c.Dropped, "adopted": c.Adopted}
	for k, v := range c.FillErrors {
		vals["fill_error."+k] = v
	}
	return meta.InTx(ctx, x.db, nil, func(tx *sql.Tx) error {
		for k, v := range vals {
			if v == 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO counters (name, value) VALUES (?, ?)
				ON CONFLICT (name) DO UPDATE SET value = value + excluded.value`, k, v); err != nil {
				return err
			}
		}
		return nil
	})
}

func (x *index) counters(ctx context.Context) (engines.CacheCounters, error) {
	c := engines.CacheCounters{FillErrors: map[string]int64{}}
	rows, err := x.db.QueryContext(ctx, `SELECT name, value FROM counters`)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return c, err
		}
		switch k {
		case "hits":
			c.Hits = v
		case "misses":
			c.Misses = v
		case "fills":
			c.Fills = v
		case "bytes_filled":
			c.BytesFilled = v
		case "evictions":
			c.Evictions = v
		case "dropped":
			c.Dropped = v
		case "adopted":
			c.Adopted = v
		default:
			if len(k) > 11 && k[:11] == "fill_error." {
				c.FillErrors[k[11:]] = v
			}
		}
	}
	return c, rows.Err()
}

// reconcile makes the index agree with the files, in one merge of two
// listings in digest order (the directory's, the index's): time and
// memory in proportion to the number of files, not to their size, and
// one transaction for what differs. A file the index lacks (its process
// died between the rename and the insert) is added as accessed now; a row
// whose file is gone is dropped.
func (x *index) reconcile(ctx context.Context, files func(yield func(engines.Entry, error) bool)) (added, dropped int, err error) {
	rows, err := x.db.QueryContext(ctx, `SELECT digest, size FROM blobs ORDER BY digest`)
	if err != nil {
		return 0, 0, err
	}
	var idx []engines.Entry
	err = engines.ScanSizes(rows, func(d blob.Digest, n int64) { idx = append(idx, engines.Entry{Digest: d, Size: n}) })
	rows.Close()
	if err != nil {
		return 0, 0, err
	}
	var add []engines.Entry
	var drop []blob.Digest
	i := 0
	for f, ferr := range files {
		if ferr != nil {
			return 0, 0, ferr
		}
		for i < len(idx) && idx[i].Digest.Compare(f.Digest) < 0 {
			drop = append(drop, idx[i].Digest)
			i++
		}
		if i < len(idx) && idx[i].Digest == f.Digest {
			if idx[i].Size != f.Size {
				add = append(add, f)
			}
			i++
			continue
		}
		add = append(add, f)
	}
	for ; i < len(idx); i++ {
		drop = append(drop, idx[i].Digest)
	}
	if len(add) == 0 && len(drop) == 0 {
		return 0, 0, nil
	}
	t := now()
	err = meta.InTx(ctx, x.db, nil, func(tx *sql.Tx) error {
		for _, e := range add {
			if _, err := tx.ExecContext(ctx, `INSERT INTO blobs (digest, size, atime) VALUES (?, ?, ?)
				ON CONFLICT (digest) DO UPDATE SET size = excluded.size`, e.Digest[:], e.Size, t); err != nil {
				return err
			}
		}
		for _, d := range drop {
			if _, err := tx.ExecContext(ctx, `DELETE FROM blobs WHERE digest = ?`, d[:]); err != nil {
				return err
			}
		}
		return nil
	})
	return len(add), len(drop), err
}

func (x *index) close() error { return x.db.Close() }
