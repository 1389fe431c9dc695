package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// errFull: everything cached is open or being filled; nothing can go.
var errFull = errors.New("every cached blob is open or being filled")

// minFree is the part of the cache's filesystem eviction keeps free
// (1/50), whatever the limit, so that the cache never fills the disk it
// shares with other things.
const minFreeDiv = 50

// makeRoom evicts least recently used copies until need more bytes fit
// the limit (the index's total plus the fills in flight on the host, in
// any process: inFlight) and onDisk more fit the filesystem's free space
// (less its reserve, and less what the fills in flight have yet to
// write): a fill writes need bytes, an adopted put's file (adopt.go) is
// on the disk already. own is the stage of the fill that asks (counted
// in need), or "".
func (e *Engine) makeRoom(ctx context.Context, need, onDisk int64, own string) error {
	e.flushTouches(ctx) // this process's recent opens are not victims
	unlock, err := e.lock(unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	skip := 0
	for {
		used, _, err := e.idx.usage(ctx)
		if err != nil {
			return err
		}
		filling, unwritten, err := e.inFlight(own)
		if err != nil {
			return err
		}
		over := used + filling + need - e.limit
		if free, ok := e.free(); ok && free-onDisk-unwritten < 0 {
			over = max(over, onDisk+unwritten-free)
		}
		if over <= 0 {
			return nil
		}
		batch, err := e.idx.oldest(ctx, skip, 64)
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			return fmt.Errorf("%w: %d bytes more than the cache can free", errFull, over)
		}
		for _, en := range batch {
			if over <= 0 {
				break
			}
			ok, err := e.evict(ctx, en.Digest)
			if err != nil {
				return err
			}
			if !ok {
				skip++
				continue
			}
			over -= en.Size
		}
	}
}

// free is the filesystem's space available to the cache, less its
// reserve.
func (e *Engine) free() (int64, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(e.dir, &st); err != nil {
		return 0, false
	}
	avail := int64(st.Bavail) * st.Bsize
	reserve := int64(st.Blocks) * st.Bsize / minFreeDiv
	return avail - reserve, true
}

// evict removes d's copy unless it is open in any process of the host,
// this one included: every open cursor holds a shared flock on its own
// descriptor of the file, and the exclusive one taken here on another
// descriptor, without waiting, fails while any does. A copy whose file is
// gone only loses its row.
func (e *Engine) evict(ctx context.Context, d blob.Digest) (bool, error) {
	f, err := os.Open(e.loc.Path(d))
	if errors.Is(err, os.ErrNotExist) {
		return true, e.idx.remove(ctx, d)
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, nil // open somewhere on this host
	}
	if err := e.loc.Delete(ctx, d); err != nil && !errors.Is(err, blob.ErrMissing) {
		return false, err
	}
	if err := e.idx.remove(ctx, d); err != nil {
		return false, err
	}
	e.count(func(c *counters) { c.evictions.Add(1) })
	e.log.Debug("cache: evicted", "digest", d.String())
	return true, nil
}

// DropAll implements engines.Cache.
func (e *Engine) DropAll(ctx context.Context) (int, int64, error) {
	unlock, err := e.lock(unix.LOCK_SH)
	if err != nil {
		return 0, 0, err
	}
	defer unlock()
	n, bytes, skip := 0, int64(0), 0
	for {
		batch, err := e.idx.oldest(ctx, skip, 256)
		if err != nil || len(batch) == 0 {
			return n, bytes, err
		}
		for _, en := range batch {
			ok, err := e.evict(ctx, en.Digest)
			if err != nil {
				return n, bytes, err
			}
			if !ok {
				skip++
				continue
			}
			n++
			bytes += en.Size
		}
	}
}

// CacheStats implements engines.Cache.
func (e *Engine) CacheStats(ctx context.Context) (engines.CacheStats, error) {
	e.flush()
	st := engines.CacheStats{Dir: e.dir, Limit: e.limit, Process: e.proc.snapshot(false)}
	var err error
	if st.Bytes, st.Blobs, err = e.idx.usage(ctx); err != nil {
		return st, err
	}
	e.mu.Lock()
	for _, f := range e.fills {
		f.mu.Lock()
		if !f.ended {
			st.Filling++
		}
		f.mu.Unlock()
	}
	e.mu.Unlock()
	st.Host, err = e.idx.counters(ctx)
	return st, err
}

func newTicker() *time.Ticker { return time.NewTicker(200 * time.Millisecond) }
