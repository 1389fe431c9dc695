package namespaces

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Lease is one life of a writer of pending links (Registry.Pend): the
// holder its intents are recorded under, kept alive while the process
// lives. Any surface that commits files to be linked later (the mount's
// incoming/ today) holds one, so every surface keeps the same rules:
//
//   - at open, the lease settles what earlier, dead lives of the same
//     writer left (every close that returned 0 is published);
//   - while it lives, a loop renews its intents every TTL/3, retries
//     settles and cancels that failed, settles the lapsed intents of any
//     holder (a host that never came back), and settles those of a life
//     of the same writer that died meanwhile;
//   - at Close, every intent still open is settled: its close returned 0.
//
// It is called a lease because that is what it is: a hold on rows that
// lapses unless renewed, like the sweep's lease in gc.
//
// # Holders and liveness
//
// A holder is Name:host:pid:id, where id is random per life: two lives of
// one writer (a lazily detached mount still serving open files, and its
// successor on the same mountpoint) never share a holder, and never
// settle each other's live intents. The pid is there for people reading
// the table; nothing reads it.
//
// Whether a life on this host still runs is decided by a lock, never by
// its pid, which the kernel hands to the next process once the holder
// dies: each life takes an exclusive flock(2) on LockDir/<id>.lock and
// holds it until it ends; the kernel drops the lock when the process
// dies, however it dies, whichever process gets its pid next. A life is
// dead when its lock file is gone (a reboot emptied the runtime
// directory; its Close removed it) or when a non-blocking flock of it
// succeeds. Every life of one writer must be given the same LockDir (a
// runtime directory of the host: a mount uses the directory of its pid
// file). A holder of another host, or whose id is not this package's,
// is never judged here: its intents wait for their lapse, decided on the
// registry's row clock (Pending.TTL), which no host's clock moves.
type Lease struct {
	cfg    LeaseConfig
	log    *slog.Logger
	prefix string // Name:host: — every life of this writer on this host
	holder string // this life's

	lockMu   sync.Mutex
	lock     *os.File // flocked for the lease's life; nil without one
	lockPath string   // where lock is: LockDir/<id>.lock

	mu         sync.Mutex
	unfinished map[Intent]bool // settle (true) or cancel (false) to retry

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	err    error
}

// LeaseConfig configures OpenLease.
type LeaseConfig struct {
	// Registry keeps the intents.
	Registry Registry
	// Name is the writer's, the same for every life of it: a mount's is
	// "mount:" and its mountpoint.
	Name string
	// TTL is how long an intent lives unless renewed (Pending.TTL): the
	// pin TTL of the store's collector, so that a dead holder's intents
	// lapse when its pins would.
	TTL time.Duration
	// LockDir holds this host's lease locks (see Lease); it is made 0700
	// if missing. It must be on a local filesystem, and the same for
	// every life of the writer.
	LockDir string
	// Logger gets the lease's warnings; nil discards them.
	Logger *slog.Logger
}

// OpenLease starts a life of the writer cfg.Name: it takes its lock,
// settles what dead lives of the writer left, and starts the renewal
// loop. Only a bad config is an error. A lock it cannot take (LockDir
// unwritable) is logged, and the lease goes on without one: its holder
// is then one that no recoverer judges, so its intents, should it die,
// wait for their lapse. A recovery the registry fails is logged and
// retried by the loop.
func OpenLease(ctx context.Context, cfg LeaseConfig) (*Lease, error) {
	switch {
	case cfg.Registry == nil:
		return nil, errors.New("namespaces: a lease needs a Registry")
	case cfg.Name == "":
		return nil, errors.New("namespaces: a lease needs a Name")
	case cfg.TTL <= 0:
		return nil, fmt.Errorf("namespaces: lease TTL %v: must be positive", cfg.TTL)
	case !filepath.IsAbs(cfg.LockDir):
		return nil, fmt.Errorf("namespaces: lease lock directory %q: must be an absolute path", cfg.LockDir)
	}
	host, _ := os.Hostname()
	l := &Lease{cfg: cfg, log: cfg.Logger, prefix: cfg.Name + ":" + host + ":", unfinished: make(map[Intent]bool)}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	id := newLeaseID()
	if f, err := takeLock(cfg.LockDir, id); err != nil {
		l.log.Warn("could not take the lock that tells other processes this writer lives; should it die, the files it closed are published only once their intents lapse",
			"dir", cfg.LockDir, "err", err)
		id = "unjudged-" + id
	} else {
		l.lock, l.lockPath = f, lockPath(cfg.LockDir, id)
	}
	l.holder = l.prefix + strconv.Itoa(os.Getpid()) + ":" + id
	l.recoverDead(ctx)
	sweepLocks(cfg.LockDir)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.done = make(chan struct{})
	go l.loop()
	return l, nil
}

// Holder is the name this life's intents are recorded under.
func (l *Lease) Holder() string { return l.holder }

// Pending describes an intent to record under the lease (Registry.Pend,
// Service.PendRows): replaces is the same file's earlier intent, or 0.
func (l *Lease) Pending(replaces Intent) Pending {
	return Pending{Holder: l.holder, TTL: l.cfg.TTL, Replaces: replaces}
}

// Settle links i's version now (Registry.Settle). A failure is returned
// and retried by the loop until it succeeds or the lease closes.
func (l *Lease) Settle(ctx context.Context, i Intent) (bool, error) {
	linked, err := l.cfg.Registry.Settle(ctx, i)
	if err != nil {
		l.retry(i, true)
	}
	return linked, err
}

// Cancel drops i unseen (Registry.Cancel), retried like Settle.
func (l *Lease) Cancel(ctx context.Context, i Intent) error {
	err := l.cfg.Registry.Cancel(ctx, i)
	if err != nil {
		l.retry(i, false)
	}
	return err
}

// Abandon drops i, an intent whose recording failed with its fate unknown:
// the put that wrote it failed at or after its COMMIT, whose answer may
// have been lost with the row committed (SQL.Pend, Service.PendRows).
// Its writer reported the failure, so i must never be linked; left
// pending, it would be renewed with the lease's others and linked at
// Close. The cancel runs at the next tick, not now: by then the server is
// done with the transaction, so a cancel cannot run before a COMMIT still
// on its way lands. It is retried like Cancel; only if this life dies
// first does a recoverer link i (the failed close then publishes whole).
func (l *Lease) Abandon(i Intent) {
	if i != 0 {
		l.retry(i, false)
	}
}

func (l *Lease) retry(i Intent, settle bool) {
	l.mu.Lock()
	l.unfinished[i] = settle
	l.mu.Unlock()
}

// Close stops the loop, settles every intent the lease still holds, and
// ends the life: its lock is dropped and its lock file removed. An error
// means some intents are left; the next life of the writer settles them
// (its lock file is gone: this life is dead). Close is idempotent.
func (l *Lease) Close() error {
	l.once.Do(func() {
		l.cancel()
		<-l.done
		ctx := context.Background()
		l.tick(ctx)
		if _, err := l.cfg.Registry.Recover(ctx, l.holder); err != nil {
			l.err = fmt.Errorf("namespaces: settle the intents of lease %s: %w", l.holder, err)
		}
		l.lockMu.Lock()
		if l.lock != nil {
			os.Remove(l.lockPath)
			l.lock.Close()
			l.lock = nil
		}
		l.lockMu.Unlock()
	})
	return l.err
}

func (l *Lease) loop() {
	defer close(l.done)
	t := time.NewTicker(max(l.cfg.TTL/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		l.tick(l.ctx)
	}
}

// tick renews, retries, and settles what dead or lapsed holders left.
func (l *Lease) tick(ctx context.Context) {
	reg := l.cfg.Registry
	l.keepLock()
	if err := reg.Renew(ctx, l.holder, l.cfg.TTL); err != nil && ctx.Err() == nil {
		l.log.Warn("could not renew the intents of files being written; they lapse after the pin TTL", "err", err)
	}
	l.mu.Lock()
	work := make(map[Intent]bool, len(l.unfinished))
	for i, s := range l.unfinished {
		work[i] = s
	}
	l.mu.Unlock()
	for i, settle := range work {
		var err error
		if settle {
			_, err = reg.Settle(ctx, i)
		} else {
			err = reg.Cancel(ctx, i)
		}
		if err == nil {
			l.mu.Lock()
			delete(l.unfinished, i)
			l.mu.Unlock()
		}
	}
	l.recoverDead(ctx)
	if _, err := reg.Recover(ctx, ""); err != nil && ctx.Err() == nil {
		l.log.Debug("could not settle lapsed intents", "err", err)
	}
}

// recoverDead settles the intents of this writer's other lives on this
// host that are dead (see Lease), and removes their lock files.
func (l *Lease) recoverDead(ctx context.Context) {
	reg := l.cfg.Registry
	holders, err := reg.Holders(ctx)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("could not look for files an earlier life of this writer closed before it died; retrying", "err", err)
		}
		return
	}
	total := 0
	for _, h := range holders {
		if h == l.holder || !strings.HasPrefix(h, l.prefix) {
			continue
		}
		id, ok := leaseID(strings.TrimPrefix(h, l.prefix))
		if !ok || !lockFree(l.cfg.LockDir, id) {
			continue
		}
		n, err := reg.Recover(ctx, h)
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("could not settle the files an earlier life of this writer closed before it died; retrying", "holder", h, "err", err)
			}
			return
		}
		total += n
		os.Remove(lockPath(l.cfg.LockDir, id))
	}
	if total > 0 {
		l.log.Info("published files whose close succeeded before an earlier life of their writer stopped", "writer", l.cfg.Name, "files", total)
	}
}

// keepLock keeps this life's lock file where recoverers look: it touches
// it (so that a cleaner of old files in /tmp spares it) and, should the
// file have been removed or replaced, takes the lock again on a new one.
func (l *Lease) keepLock() {
	l.lockMu.Lock()
	defer l.lockMu.Unlock()
	if l.lock == nil {
		return
	}
	now := time.Now()
	os.Chtimes(l.lockPath, now, now)
	have, err1 := l.lock.Stat()
	there, err2 := os.Stat(l.lockPath)
	if err1 == nil && err2 == nil && os.SameFile(have, there) {
		return
	}
	id := strings.TrimSuffix(filepath.Base(l.lockPath), ".lock")
	f, err := takeLock(l.cfg.LockDir, id)
	if err != nil {
		l.log.Warn("this writer's lock file was removed and cannot be made again; another life of the writer may publish its open files early",
			"path", l.lockPath, "err", err)
		return
	}
	l.lock.Close()
	l.lock = f
	l.log.Warn("this writer's lock file was removed; made it again", "path", l.lockPath)
}

// newLeaseID returns 32 random lowercase hex digits.
func newLeaseID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// leaseID returns the id of a holder's "pid:id" tail, if it is one this
// package made (newLeaseID).
func leaseID(tail string) (string, bool) {
	pid, id, ok := strings.Cut(tail, ":")
	if !ok || pid == "" || strings.Trim(pid, "0123456789") != "" || len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
		return "", false
	}
	return id, true
}

func lockPath(dir, id string) string { return filepath.Join(dir, id+".lock") }

// takeLock makes dir/id.lock and takes an exclusive flock on it. The
// file is locked under a temporary name first and renamed into place, so
// that no recoverer ever finds it unlocked while its life runs.
func takeLock(dir, id string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, id+".*.tmp")
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(tmp.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("flock %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), lockPath(dir, id)); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, err
	}
	return tmp, nil
}

// sweepLocks removes the lock files of dead lives that left no intents
// (a crash-looping daemon leaves one per life), and temporary ones more
// than a minute old (a life that died while taking its lock). Removing a
// dead life's file is always safe: a missing file says dead too.
func sweepLocks(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".lock"):
			id := strings.TrimSuffix(name, ".lock")
			if _, ok := leaseID("0:" + id); ok && lockFree(dir, id) {
				os.Remove(filepath.Join(dir, name))
			}
		case strings.HasSuffix(name, ".tmp"):
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute && fileFree(filepath.Join(dir, name)) {
				os.Remove(filepath.Join(dir, name))
			}
		}
	}
}

// lockFree reports whether the life whose lock is dir/id.lock is dead: its
// file is gone, or a non-blocking flock of it succeeds (the kernel dropped
// the holder's lock with its process). Any other failure says alive: a
// live holder's intents are never settled early, and a dead one's lapse.
func lockFree(dir, id string) bool { return fileFree(lockPath(dir, id)) }

func fileFree(path string) bool {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
}
