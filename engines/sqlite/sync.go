package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Sync implements engines.Syncer: it fdatasyncs the write-ahead log, so
// that every transaction committed before the call survives a power loss.
//
// Why the WAL alone is enough. With synchronous=NORMAL a commit appends
// its frames to the WAL (<path>-wal) and syncs nothing. SQLite syncs the
// WAL before a checkpoint copies frames into the database file and syncs
// the database file after, before it records the frames as copied; it
// starts the WAL over (writes a new header, which it syncs, then frames
// from the start of the file) only once every frame of it was copied,
// and deletes it (the last connection closing) only after such a
// checkpoint. The database file is written by checkpoints only. So a
// frame committed before Sync was called is, when the fdatasync below
// runs, either still in the WAL file, whose dirty pages the fdatasync
// writes (the page cache is the file's, shared by every descriptor and
// process: a commit of another process on the store is covered too), or
// already in the database file, synced. A WAL file deleted and created
// again since the descriptor was opened is noticed by its inode before
// each fdatasync, and the new one opened: the old one's frames were all
// checkpointed, and synced, before it went.
//
// Syncs are shared: callers that arrive while one runs wait for the next,
// one fdatasync for all of them (the running one may have started before
// their commits). A sync finds out from PRAGMA data_version, on a
// connection kept for it, whether anything committed since the last sync
// began; if nothing did it returns at once, without touching the disk, so
// that a timer may call it often on an idle store.
//
// A failed fdatasync is final: Linux marks the pages it could not write
// clean, so a later fdatasync would succeed without them. Every later Sync
// returns the first error.
func (e *Engine) Sync(ctx context.Context) error {
	if e.ro {
		return nil // nothing is written through a read-only engine
	}
	// What the close journal took must be in the WAL first, or, for
	// records the database refuses for now, synced in the journal.
	if err := e.batch.Visible(ctx); err != nil {
		return e.wrap("sync", err)
	}
	if err := e.meta.Journal().SyncRetained(); err != nil {
		return e.wrap("sync", err)
	}
	return e.syncs.do(ctx, func() error { return e.wal.sync(ctx) })
}

// walSync is the state of the engine's WAL syncs. Only syncGroup's
// current run touches it (runs never overlap).
type walSync struct {
	path string // the WAL file: the database's path + "-wal"
	// db is a pool of its own for conn, the connection PRAGMA data_version
	// is read on: the value changes when another connection commits, so it
	// must be the same one every time. Held for the engine's life, it also
	// keeps the process connected, so that SQLite never deletes the WAL
	// under f while the engine's pool opens and closes connections.
	db   *sql.DB
	conn *sql.Conn
	f    *os.File // the WAL as last opened; nil: not yet (or it was gone)
	// version is data_version as read before the last successful
	// fdatasync; valid says it is.
	version int64
	valid   bool
	failed  error // the first fdatasync error: every later sync returns it
	// fdatasyncs counts the fdatasyncs run (tests read it).
	fdatasyncs atomic.Int64
}

// open opens the connection of dsn that syncs read data_version on.
func (w *walSync) open(ctx context.Context, dsn, path string) error {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return fmt.Errorf("the connection for syncs: %w", err)
	}
	w.path, w.db, w.conn = path, db, conn
	return nil
}

func (w *walSync) sync(ctx context.Context) error {
	if w.failed != nil {
		return w.failed
	}
	v, verr := w.dataVersion(ctx)
	if verr == nil && w.valid && v == w.version {
		return nil // nothing committed since the last sync began
	}
	w.valid = false
	if err := w.fdatasync(); err != nil {
		w.failed = fmt.Errorf("sync %s: %w (every later sync of this database fails too: pages that could not be written may be lost)", w.path, err)
		return w.failed
	}
	w.version, w.valid = v, verr == nil
	return nil
}

// dataVersion reads PRAGMA data_version on the kept connection, getting a
// new one if it broke (the value of a new connection is compared with
// nothing: the next sync syncs).
func (w *walSync) dataVersion(ctx context.Context) (int64, error) {
	// Without cancellation: the pragma takes microseconds, and a canceled
	// query could leave the connection unusable.
	ctx = context.WithoutCancel(ctx)
	var v int64
	err := sql.ErrConnDone
	if w.conn != nil {
		err = w.conn.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v)
	}
	if err != nil {
		if w.conn != nil {
			w.conn.Close()
		}
		w.conn, w.valid = nil, false
		if c, cerr := w.db.Conn(ctx); cerr == nil {
			w.conn = c
		}
		return 0, err
	}
	return v, nil
}

// fdatasync syncs the file now at the WAL's path, reopening it if it is
// not the one f holds. With no WAL file there is nothing to sync: its
// frames were all checkpointed, and SQLite synced the database file.
func (w *walSync) fdatasync() error {
	there, err := os.Stat(w.path)
	if errors.Is(err, fs.ErrNotExist) {
		w.closeFile()
		return nil
	}
	if err != nil {
		return err
	}
	if w.f != nil {
		if mine, err := w.f.Stat(); err != nil || !os.SameFile(mine, there) {
			w.closeFile()
		}
	}
	if w.f == nil {
		f, err := os.Open(w.path) // fdatasync works on a read-only descriptor
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted since the Stat: checkpointed
		}
		if err != nil {
			return err
		}
		// A new WAL file: its directory entry must be durable too. SQLite
		// syncs the directory at the WAL's first sync, which NORMAL may
		// not have reached yet.
		if err := syncDir(filepath.Dir(w.path)); err != nil {
			f.Close()
			return err
		}
		w.f = f
	}
	w.fdatasyncs.Add(1)
	if err := unix.Fdatasync(int(w.f.Fd())); err != nil {
		return fmt.Errorf("fdatasync: %w", err)
	}
	return nil
}

func (w *walSync) closeFile() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
}

// close releases the descriptor and the connection; the group has no
// run going any more.
func (w *walSync) close() error {
	w.closeFile()
	var errs []error
	if w.conn != nil {
		errs = append(errs, w.conn.Close())
	}
	if w.db != nil {
		errs = append(errs, w.db.Close())
	}
	return errors.Join(errs...)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// syncGroup shares one run of a sync among concurrent callers. A caller
// needs a run that starts after it arrived: it joins the run queued
// behind the running one, or, when none is queued, queues one and runs it
// itself once the running one ended. Runs never overlap.
//
// It is not a group.Commit: a run commits nothing of its callers (each
// caller's work committed before it asked), so a caller that joined may
// stop waiting when its context ends, and no runner goroutine or batch of
// jobs is needed — the caller that queued the run runs it.
type syncGroup struct {
	mu     sync.Mutex
	last   *syncRun // the newest run (queued, running or done); nil: none yet
	queued *syncRun // a run not started yet, which arrivals join
	closed bool
}

type syncRun struct {
	done chan struct{}
	err  error
}

// do runs fn, or waits for a run of it that starts after do was called.
// A caller that joined a run stops waiting when ctx ends; the caller that
// runs it does not, since the others wait for it.
func (g *syncGroup) do(ctx context.Context, fn func() error) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return blob.ErrClosed
	}
	if r := g.queued; r != nil {
		g.mu.Unlock()
		select {
		case <-r.done:
			return r.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r := &syncRun{done: make(chan struct{})}
	prev := g.last
	g.last, g.queued = r, r
	g.mu.Unlock()
	if prev != nil {
		<-prev.done
	}
	g.mu.Lock()
	g.queued = nil // starting: a caller from now on needs the next run
	g.mu.Unlock()
	r.err = fn()
	close(r.done)
	return r.err
}

// close refuses new callers and waits for the last run to end.
func (g *syncGroup) close() {
	g.mu.Lock()
	g.closed = true
	last := g.last
	g.mu.Unlock()
	if last != nil {
		<-last.done
	}
}
