package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The GC lease keeps garbage collection to one process per store. Pins are
// in-process: a mount knows which blobs its open files hold, another
// process does not, so a sweep or a direct delete from another process
// could remove a blob the mount is serving. The mount holds the lease for
// its lifetime; `sweep` and `rm` take it for their run and, when another
// process holds it, do nothing (a sweep reports Aborted: SweeperLock, rm
// fails). Two mounts of one store would be the same hazard, so the second
// is refused.
//
// On SQLite the lease is an flock(2) on a file beside the database; on
// PostgreSQL a session advisory lock held on one pooled connection. Both
// are released by the kernel or the server when their holder dies, kill -9
// included. (A PostgreSQL restart drops the advisory lock while a mount
// runs; several hosts sharing one pool safely is fleet mode, DESIGN.md
// §7.) A mem kv store dies with its process and needs none.

// errLeaseHeld: another process holds the store's GC lease.
var errLeaseHeld = errors.New("held by another process")

// lease is a held GC lease; release is idempotent.
type lease interface{ release() }

// acquireLease takes st's GC lease without waiting: an error wrapping
// errLeaseHeld names the holder when another process has it.
func (a *app) acquireLease(ctx context.Context, st *store.Store) (lease, error) {
	if pg, ok := st.KV().(*postgres.Engine); ok {
		return acquirePGLease(ctx, pg)
	}
	return acquireGCLease(a.leasePath)
}

// holdLease is acquireLease for a command that must not run beside
// another holder: a held lease becomes an error ending in hint.
func (a *app) holdLease(ctx context.Context, st *store.Store, hint string) (lease, error) {
	l, err := a.acquireLease(ctx, st)
	if errors.Is(err, errLeaseHeld) {
		return nil, fmt.Errorf("%w: %s", err, hint)
	}
	return l, err
}

// pgLeaseKey is the advisory lock key of the GC lease ("alkgcls" in ASCII;
// the engines' schema creation holds "alkblob"). Advisory locks are per
// database, so per store.
const pgLeaseKey = 0x616c6b67636c73

type pgLease struct{ conn *pgxpool.Conn }

func acquirePGLease(ctx context.Context, pg *postgres.Engine) (lease, error) {
	conn, err := pg.Pool().Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("gc lease on %s: %w", pg.Name(), err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(pgLeaseKey)).Scan(&got); err != nil {
		conn.Release()
		return nil, fmt.Errorf("gc lease on %s: %w", pg.Name(), err)
	}
	if !got {
		conn.Release()
		return nil, fmt.Errorf("the store's GC lease (advisory lock %#x on %s) is %w", pgLeaseKey, pg.Name(), errLeaseHeld)
	}
	return &pgLease{conn: conn}, nil
}

func (l *pgLease) release() {
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(pgLeaseKey)); err != nil {
		// Never hand a connection that may still hold the lock back to
		// the pool: closing the session drops it.
		l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
	l.conn = nil
}

// gcLease is a held flock lease. A zero gcLease (no lease file for this
// store) releases nothing.
type gcLease struct{ f *os.File }

func (l *gcLease) release() {
	if l != nil && l.f != nil {
		l.f.Close() // closing the descriptor drops the flock
		l.f = nil
	}
}

// acquireGCLease takes the lease at path without waiting; "" means the
// store has none. It fails with an error wrapping errLeaseHeld, naming the
// holder's pid, when another process has it.
func acquireGCLease(path string) (lease, error) {
	if path == "" {
		return &gcLease{}, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("gc lease %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("the store's GC lease %s is %w%s", path, errLeaseHeld, holder)
		}
		return nil, fmt.Errorf("gc lease %s: %w", path, err)
	}
	// Record who holds it, for the message another process prints.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &gcLease{f: f}, nil
}

func readHolder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid := strings.TrimSpace(string(b[:n])); pid != "" {
		return " (pid " + pid + ")"
	}
	return ""
}
