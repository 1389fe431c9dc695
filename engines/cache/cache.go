package cache

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/local"
)

// Options configures a cache.
type Options struct {
	// Dir is the cache directory (created 0700).
	Dir string
	// Limit bounds the bytes of the cached blobs; required.
	Limit int64
	// Log may be nil.
	Log *slog.Logger
	// Parallel is the number of ranged reads one fill keeps in flight
	// (default 4); Segment the size of each (default 16 MiB).
	Parallel int
	Segment  int64
	// FillWait is how long a miss waits for another process's fill of
	// the same blob to make progress before it reads the blob from the
	// remote tier without filling (default 10 s; claim.go).
	FillWait time.Duration
}

// Engine is a remote large tier with a local cache in front (see the
// package doc). Wrap it with [New]'s result, not directly: the result
// also has the remote's optional capabilities.
type Engine struct {
	remote engines.Large
	loc    *local.Engine
	idx    *index
	dir    string
	limit  int64
	log    *slog.Logger
	par    int
	seg    int64
	wait   time.Duration // Options.FillWait

	ctx    context.Context // fills' lifetime; Close cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	fills map[blob.Digest]*fill

	proc   counters // this process, since Open
	unsent counters // not yet added to the index's host counters
	flushT *time.Ticker
	closed atomic.Bool

	onVerified atomic.Pointer[func(blob.Digest, engines.FileID)] // OnVerified

	touchMu sync.Mutex
	touched map[blob.Digest]int64 // opens not yet in the index (flushTouches)
}

// OnVerified sets fn to be told of each copy a fill of this process
// published after hashing it whole to its digest, with the identity of
// the file published (fill.go: publish); the store records it as known
// good (store/verdicts.go), so that --verify=full passes the copy through
// from its next open instead of verifying it once more. fn must be cheap.
func (e *Engine) OnVerified(fn func(d blob.Digest, id engines.FileID)) { e.onVerified.Store(&fn) }

func (e *Engine) verified(d blob.Digest, id engines.FileID) {
	if fn := e.onVerified.Load(); fn != nil {
		(*fn)(d, id)
	}
}

// counters are engines.CacheCounters, atomically.
type counters struct {
	hits, misses, fills, bytesFilled, evictions, dropped, adopted atomic.Int64
	fillErr                                                       sync.Map // cause → *atomic.Int64
}

func (c *counters) fillError(cause string) {
	v, _ := c.fillErr.LoadOrStore(cause, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// snapshot reads c; take also zeroes what it read.
func (c *counters) snapshot(take bool) engines.CacheCounters {
	ld := func(a *atomic.Int64) int64 {
		if take {
			return a.Swap(0)
		}
		return a.Load()
	}
	out := engines.CacheCounters{Hits: ld(&c.hits), Misses: ld(&c.misses), Fills: ld(&c.fills),
		BytesFilled: ld(&c.bytesFilled), Evictions: ld(&c.evictions), Dropped: ld(&c.dropped), Adopted: ld(&c.adopted), FillErrors: map[string]int64{}}
	c.fillErr.Range(func(k, v any) bool {
		if n := ld(v.(*atomic.Int64)); n != 0 || !take {
			out.FillErrors[k.(string)] = n
		}
		return true
	})
	return out
}

// both counts in the process's counters and in those still to be sent
// to the host's.
func (e *Engine) count(f func(c *counters)) {
	f(&e.proc)
	f(&e.unsent)
}

var (
	_ engines.Large         = (*Engine)(nil)
	_ engines.SidecarReader = (*Engine)(nil)
	_ engines.Cache         = (*Engine)(nil)
	_ engines.BatchSizer    = (*Engine)(nil)
	_ engines.StatFS        = (*Engine)(nil)
)

// New opens the cache in opt.Dir in front of remote and returns it as a
// large engine with remote's optional capabilities (the window host and
// locator of pglo, the shared medium of S3). The cache owns remote: its
// Close closes remote. At open it removes the stage files of fills that a
// killed process left (engines/local), and makes the index agree with the
// files (index.reconcile).
func New(ctx context.Context, remote engines.Large, opt Options) (engines.Large, *Engine, error) {
	if opt.Limit <= 0 {
		return nil, nil, errors.New("cache: a size limit is required")
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.Parallel <= 0 {
		opt.Parallel = 4
	}
	if opt.Segment <= 0 {
		opt.Segment = 16 << 20
	}
	if opt.FillWait <= 0 {
		opt.FillWait = 10 * time.Second
	}
	if err := os.MkdirAll(opt.Dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("cache %s: %w", opt.Dir, err)
	}
	if !engines.Writable(opt.Dir) {
		return nil, nil, fmt.Errorf("cache %s: not writable by this user, or on a read-only filesystem", opt.Dir)
	}
	e := &Engine{remote: remote, dir: opt.Dir, limit: opt.Limit, log: opt.Log, par: opt.Parallel, seg: opt.Segment, wait: opt.FillWait,
		fills: map[blob.Digest]*fill{}}
	unlock, err := e.lock(unix.LOCK_EX)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	if e.loc, err = local.Open(ctx, opt.Dir, opt.Log); err != nil {
		return nil, nil, fmt.Errorf("cache %s: %w", opt.Dir, err)
	}
	if e.idx, err = openIndex(ctx, opt.Dir); err != nil {
		return nil, nil, err
	}
	start := time.Now()
	added, dropped, err := e.idx.reconcile(ctx, e.loc.List(ctx, blob.Digest{}))
	if err != nil {
		e.idx.close()
		return nil, nil, fmt.Errorf("cache %s: rebuild the index: %w", opt.Dir, err)
	}
	if added > 0 || dropped > 0 {
		opt.Log.Info("cache index rebuilt from its files", "dir", opt.Dir, "added", added, "dropped", dropped, "took", time.Since(start).Round(time.Millisecond))
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.flushT = time.NewTicker(2 * time.Second)
	e.wg.Add(1)
	go e.flusher()
	return wrap(e), e, nil
}

// lock takes the directory's flock (dir/lock): shared for a publish or an
// eviction, exclusive for the rebuild at open, so that a rebuild never
// sees a file renamed in without its row.
func (e *Engine) lock(how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(e.dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", e.dir, err)
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("cache %s: lock: %w", e.dir, err)
	}
	return func() { f.Close() }, nil
}

func (e *Engine) flusher() {
	defer e.wg.Done()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-e.flushT.C:
			e.flush()
		}
	}
}

// flushTouches writes this process's opens since the last flush into the
// index (index.touch): with the counters, and before an eviction picks
// its victims.
func (e *Engine) flushTouches(ctx context.Context) {
	e.touchMu.Lock()
	at := e.touched
	e.touched = nil
	e.touchMu.Unlock()
	if err := e.idx.touch(ctx, at); err != nil {
		e.log.Debug("cache: could not record accesses", "copies", len(at), "err", err)
	}
}

// flush adds what this process counted to the host's counters, and its
// opens to the index.
func (e *Engine) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.flushTouches(ctx)
	c := e.unsent.snapshot(true)
	if c.Hits == 0 && c.Misses == 0 && c.Fills == 0 && c.BytesFilled == 0 && c.Evictions == 0 && c.Dropped == 0 && c.Adopted == 0 && len(c.FillErrors) == 0 {
		return
	}
	if err := e.idx.addCounters(ctx, c); err != nil {
		e.log.Debug("cache: could not add to the host's counters", "err", err)
	}
}

// Name implements engines.Engine: the remote's.
func (e *Engine) Name() string { return e.remote.Name() }

// Dir is the cache directory.
func (e *Engine) Dir() string { return e.dir }

// Root implements engines.StatFS: the cache directory. A hit is a local
// file, so the mount probes this filesystem for passthrough (without it,
// every cached read went through the daemon) and its df reports it.
func (e *Engine) Root() string { return e.dir }

// Remote is the remote tier.
func (e *Engine) Remote() engines.Large { return e.remote }

// Has implements engines.Engine: the remote tier's answer. A local copy
// does not say the pool still holds a blob (another host's sweep may have
// deleted it).
func (e *Engine) Has(ctx context.Context, d blob.Digest) (bool, error) { return e.remote.Has(ctx, d) }

// Size implements engines.Engine without reaching the remote tier for a
// blob whose size this host knows (content addressing: it cannot change):
// a cached blob's is its file's, and any other's is the one the remote
// gave once, to any process of the host (the index's sizes), so that ls
// -l and stat answer with the remote tier slow or down. A size row goes
// with the blob's Delete here; another host's sweep leaves it, as it
// leaves a cached copy (see Corruption and deletes in the package doc).
// Under engines.Direct it is the remote's answer.
func (e *Engine) Size(ctx context.Context, d blob.Digest) (int64, error) {
	if engines.IsDirect(ctx) {
		return e.remote.Size(ctx, d)
	}
	if n, ok := e.localSize(ctx, d); ok {
		return n, nil
	}
	n, err := e.remote.Size(ctx, d)
	if err == nil {
		e.learn(ctx, []engines.Entry{{Digest: d, Size: n}})
	}
	return n, err
}

// SizeMany implements engines.BatchSizer: Size for many digests, with the
// sizes the remote gives recorded in one transaction (a listing).
func (e *Engine) SizeMany(ctx context.Context, ds []blob.Digest) ([]int64, error) {
	out := make([]int64, len(ds))
	var learnt []engines.Entry
	defer func() { e.learn(ctx, learnt) }()
	direct := engines.IsDirect(ctx)
	for i, d := range ds {
		if !direct {
			if n, ok := e.localSize(ctx, d); ok {
				out[i] = n
				continue
			}
		}
		n, err := e.remote.Size(ctx, d)
		switch {
		case err == nil:
			out[i] = n
			learnt = append(learnt, engines.Entry{Digest: d, Size: n})
		case errors.Is(err, blob.ErrMissing):
			out[i] = -1
		default:
			return nil, err
		}
	}
	return out, nil
}

// localSize is the remote's size as this host recorded it, else the
// copy's: a copy truncated or replaced by hand must not change the size
// the mount and HTTP announce.
func (e *Engine) localSize(ctx context.Context, d blob.Digest) (int64, bool) {
	if n, ok := e.idx.knownSize(ctx, d); ok {
		return n, true
	}
	if fi, err := os.Stat(e.loc.Path(d)); err == nil {
		return fi.Size(), true
	}
	return 0, false
}

func (e *Engine) learn(ctx context.Context, es []engines.Entry) {
	if err := e.idx.learnSizes(ctx, es); err != nil {
		e.log.Debug("cache: could not record sizes", "err", err)
	}
}

// List implements engines.Engine: the remote tier's listing.
func (e *Engine) List(ctx context.Context, after blob.Digest) iter.Seq2[engines.Entry, error] {
	return e.remote.List(ctx, after)
}

// Stage implements engines.Large: the remote tier's stage.
func (e *Engine) Stage(ctx context.Context) (engines.Stage, error) { return e.remote.Stage(ctx) }

// Sidecar implements engines.SidecarReader: the local copy's, else the
// remote's.
func (e *Engine) Sidecar(ctx context.Context, d blob.Digest) ([]byte, error) {
	if !engines.IsDirect(ctx) {
		if b, err := e.loc.Sidecar(ctx, d); err == nil {
			return b, nil
		}
	}
	return remoteSidecar(ctx, e.remote, d)
}

func remoteSidecar(ctx context.Context, r engines.Engine, d blob.Digest) ([]byte, error) {
	sr, ok := r.(engines.SidecarReader)
	if !ok {
		return nil, blob.Wrap("sidecar", r.Name(), d, blob.ErrMissing)
	}
	return sr.Sidecar(ctx, d)
}

// Delete implements engines.Engine: the remote's delete, then this host's
// copy's, whatever the remote said (a sweep that found it gone there
// still means it is garbage here).
func (e *Engine) Delete(ctx context.Context, d blob.Digest) error {
	err := e.remote.Delete(ctx, d)
	e.dropLocal(ctx, d, false)
	if ferr := e.idx.forgetSize(ctx, d); ferr != nil {
		e.log.Warn("cache: could not forget a deleted blob's size", "digest", d.String(), "err", ferr)
	}
	return err
}

// dropLocal removes d's local copy and its row; open cursors keep reading
// the unlinked file.
func (e *Engine) dropLocal(ctx context.Context, d blob.Digest, corrupt bool) {
	unlock, err := e.lock(unix.LOCK_SH)
	if err != nil {
		e.log.Warn("cache: could not drop a copy", "digest", d.String(), "err", err)
		return
	}
	defer unlock()
	err = e.loc.Delete(ctx, d)
	if err != nil && !errors.Is(err, blob.ErrMissing) {
		e.log.Warn("cache: could not remove a copy", "digest", d.String(), "err", err)
		return
	}
	if err := e.idx.remove(ctx, d); err != nil {
		e.log.Warn("cache: could not remove a copy's row", "digest", d.String(), "err", err)
	}
	if corrupt && err == nil {
		e.count(func(c *counters) { c.dropped.Add(1) })
	}
}

// Close implements engines.Engine: it stops the fills in flight (their
// stages are dropped), adds this process's counters to the host's and
// closes the remote tier.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.cancel()
	e.flushT.Stop()
	// Wake the fills' goroutines and cut their remote reads short.
	e.mu.Lock()
	fills := make([]*fill, 0, len(e.fills))
	for _, f := range e.fills {
		fills = append(fills, f)
	}
	e.mu.Unlock()
	for _, f := range fills {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
		f.closeSrc()
	}
	e.wg.Wait()
	e.flush()
	return errors.Join(e.idx.close(), e.loc.Close(), e.remote.Close())
}

// Open implements engines.Engine. A cached blob is a cursor over its local
// file (an engines.FileCursor: the mount may pass it through); a miss
// joins the fill of the blob in flight in this process, or starts one,
// and reads through it (fill.go). Under engines.Direct it is the remote's
// Open.
func (e *Engine) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	if engines.IsDirect(ctx) {
		return e.remote.Open(ctx, d)
	}
	if c, ok := e.openHit(ctx, d); ok {
		e.count(func(c *counters) { c.hits.Add(1) })
		return c, nil
	}
	e.count(func(c *counters) { c.misses.Add(1) })
	return e.openMiss(ctx, d)
}

// openHit opens d's local copy under a shared flock, which an eviction
// (in any process) must take exclusively: an open copy is never evicted.
// A copy evicted between the open and the lock is no longer at its path:
// a miss then.
func (e *Engine) openHit(ctx context.Context, d blob.Digest) (engines.Cursor, bool) {
	cur, err := e.loc.Open(ctx, d)
	if err != nil {
		return nil, false
	}
	fc := cur.(engines.FileCursor)
	fd := int(fc.File().Fd())
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		cur.Close() // being evicted
		return nil, false
	}
	var mine unix.Stat_t
	var there unix.Stat_t
	if unix.Fstat(fd, &mine) != nil || unix.Stat(e.loc.Path(d), &there) != nil || mine.Ino != there.Ino || mine.Dev != there.Dev {
		cur.Close()
		return nil, false
	}
	// A copy of the wrong size (truncated, or another blob's file put in
	// its place) is damaged whatever its bytes: the store would verify it
	// against the wrong length, so it is dropped here and the blob is a
	// miss, read from the remote tier.
	if want, ok := e.idx.knownSize(ctx, d); ok && want != mine.Size {
		cur.Close()
		e.log.Warn("cached copy of a blob has the wrong size; dropping it and reading the blob from the remote tier again",
			"digest", d.String(), "dir", e.dir, "size", mine.Size, "want", want)
		e.dropLocal(ctx, d, true)
		return nil, false
	}
	e.touchMu.Lock()
	if e.touched == nil {
		e.touched = map[blob.Digest]int64{}
	}
	e.touched[d] = now()
	e.touchMu.Unlock()
	return &hitCursor{e: e, d: d, FileCursor: fc}, true
}

// hitCursor reads a local copy. Refetch (the store found a chunk corrupt)
// drops the copy and serves the rest from the remote tier; File then
// stops naming a file (no passthrough, no verdict about it).
type hitCursor struct {
	engines.FileCursor
	e *Engine
	d blob.Digest

	mu      sync.RWMutex
	refetch engines.Cursor // set by Refetch
	closed  bool
}

var (
	_ engines.FileCursor = (*hitCursor)(nil)
	_ engines.Refetcher  = (*hitCursor)(nil)
)

func (h *hitCursor) ReadAt(p []byte, off int64) (int, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.refetch != nil {
		return h.refetch.ReadAt(p, off)
	}
	return h.FileCursor.ReadAt(p, off)
}

func (h *hitCursor) File() engines.FileHandle {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.refetch != nil {
		return noFile{}
	}
	return h.FileCursor.File()
}

// noFile is a File that no longer is one: Fstat fails on it.
type noFile struct{}

func (noFile) Fd() uintptr  { return ^uintptr(0) }
func (noFile) Name() string { return "" }

// Refetch implements engines.Refetcher.
func (h *hitCursor) Refetch() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refetch != nil || h.closed {
		return nil
	}
	h.e.log.Warn("cached copy of a blob failed verification; dropping it and reading the blob from the remote tier again",
		"digest", h.d.String(), "dir", h.e.dir)
	h.e.dropLocal(context.Background(), h.d, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := h.e.openMiss(ctx, h.d)
	if err != nil {
		return err
	}
	h.refetch = c
	return nil
}

func (h *hitCursor) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	var err error
	if h.refetch != nil {
		err = h.refetch.Close()
	}
	return errors.Join(h.FileCursor.Close(), err)
}

// isNoSpace reports a full disk or quota.
func isNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}
