package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The journal's guard of what a close is judged against.
//
// A journaled put is judged when it is taken, not when its record
// applies: its namespace must exist and have no quota then. Two things
// another process (or this one) may do change that: remove the namespace
// (ns rm, which refuses a namespace that holds anything) and set its
// quota. Both hold an exclusive flock(2) on <database>-closes/namespaces
// while they do it; a put holds a shared one from its check to its
// record's write. So a put is either judged after such a change committed
// or written before it began, and:
//
//   - a removal first waits until every record written before it is
//     applied (this process's, and every other live process's: the
//     segments' marks reach their ends; a dead process's are replayed),
//     so that a namespace a close was acknowledged into is not empty to
//     it;
//   - a quota change is seen by every put taken after it: the change
//     appends a byte to the file, whose size is the generation the
//     journal's cache of namespace quotas is valid for (a stat per put,
//     under the shared lock, instead of a query).

// guardWait bounds how long a removal waits for other processes'
// records, and a change for the lock.
const guardWait = 10 * time.Second

// nsGen is the namespaces file's identity and size: what a cached answer
// is valid for.
type nsGen struct {
	ino  uint64
	size int64
}

func (j *Journal) nsPath() string { return filepath.Join(j.dir, "namespaces") }

// shareLocked takes the shared lock (j.mu held), opening the file first
// if needed, and reports whether it did: false while a removal or a
// quota change holds the lock (or the file cannot be had), and the put
// then commits directly, judged in its own transaction.
func (j *Journal) shareLocked() bool {
	if j.nsf == nil {
		if err := os.MkdirAll(j.dir, 0o700); err != nil {
			return false
		}
		f, err := os.OpenFile(j.nsPath(), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return false
		}
		j.nsf = f
	}
	return flock(j.nsf, unix.LOCK_SH|unix.LOCK_NB) == nil
}

// unshareLocked releases it.
func (j *Journal) unshareLocked() { unix.Flock(int(j.nsf.Fd()), unix.LOCK_UN) }

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// unlimitedLocked reports whether namespace name exists and has no quota
// (j.mu and the shared lock held): from the cache while the generation is
// the one it was filled at, else from the database.
func (j *Journal) unlimitedLocked(ctx context.Context, l *Links, name string) bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(j.nsf.Fd()), &st); err != nil {
		return false
	}
	gen := nsGen{ino: st.Ino, size: st.Size}
	if gen != j.gen || j.free == nil {
		j.gen, j.free = gen, make(map[string]bool)
	}
	if free, ok := j.free[name]; ok {
		return free
	}
	free, err := l.unlimited(ctx, name)
	if err != nil {
		return false
	}
	j.free[name] = free
	return free
}

// Guard runs change (a namespace's removal, or its quota's change) under
// the exclusive lock, after every journaled record written before it is
// applied when drain is set (a removal must find what they link; a new
// quota must count what they charge), and moves the generation on, so
// that puts taken after it judge the namespace afresh. Without a journal
// it runs change alone.
func (j *Journal) Guard(ctx context.Context, drain bool, change func() error) error {
	if j == nil {
		return change()
	}
	if err := os.MkdirAll(j.dir, 0o700); err != nil {
		return fmt.Errorf("close journal: %w", err)
	}
	f, err := os.OpenFile(j.nsPath(), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("close journal: %w", err)
	}
	defer f.Close()
	deadline := time.Now().Add(guardWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("close journal: lock %s: %w", f.Name(), err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("close journal: %s stayed locked by puts for %v", f.Name(), guardWait)
		}
		time.Sleep(time.Millisecond)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if drain {
		if err := j.drain(ctx, deadline); err != nil {
			return err
		}
	}
	// The generation moves on before the change, whatever it does: no put
	// judges a namespace while the lock is held, and a crash after the
	// change committed must not leave a cache that predates it.
	if _, err := f.Write([]byte{'.'}); err != nil {
		return fmt.Errorf("close journal: %w", err)
	}
	return change()
}

// drain waits until every record written so far, by any process, is
// applied: this process's (Visible), a dead one's (replayed), a live
// one's (its segment's mark at its end).
func (j *Journal) drain(ctx context.Context, deadline time.Time) error {
	if err := j.Applied(ctx); err != nil {
		return err
	}
	if _, err := j.ReplayDead(ctx); err != nil {
		return err
	}
	own, _ := j.own.Load().(string)
	for {
		behind, dead, err := j.behind(ctx, own)
		if err != nil || behind == "" {
			return err
		}
		if dead {
			return fmt.Errorf("close journal: %s holds closes a dead process acknowledged that cannot be applied (see the log)", behind)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("close journal: the closes another process acknowledged (%s) are not written to the database after %v", behind, guardWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// behind names a segment other than own whose mark is short of its end,
// "" if none is, and whether its process is dead (nobody holds its
// lock): ReplayDead ran before, so such a segment is one it kept.
func (j *Journal) behind(ctx context.Context, own string) (path string, dead bool, err error) {
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return "", false, fmt.Errorf("close journal: %w", err)
	}
	for _, e := range ents {
		seg, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok || seg == own {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", false, err
		}
		var mark int64
		if err := j.markGet.QueryRowContext(ctx, seg).Scan(&mark); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return "", false, err
		}
		if mark < info.Size() {
			p := filepath.Join(j.dir, e.Name())
			return p, unlocked(p), nil
		}
	}
	return "", false, nil
}

// unlocked reports whether nobody holds path's lock (a test lock, let go
// at once).
func unlocked(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return true
}
