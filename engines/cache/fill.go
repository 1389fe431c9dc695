package cache

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// A fill copies one blob from the remote tier into a stage file of the
// cache, in segments: Parallel workers fetch the segments in order with
// ranged reads of the remote cursor, and a reader that needs a segment no
// one has started fetches it itself, so that its first byte never waits
// for the whole blob. A segment once written is read from the stage. The
// hasher reads the segments back in order (from the page cache) and, when
// the whole blob hashes to its digest, the stage is published by rename
// (local.Engine's Commit: fsync, rename, no replace); only then is the
// copy in the cache. Any failure — the remote tier, a full disk, a digest
// mismatch — drops the stage, and the readers go on from the remote tier.
type fill struct {
	e    *Engine
	d    blob.Digest
	size int64
	src  engines.Cursor // the remote's; shared by the workers and the readers
	st   *stageFile     // claimed: this process is the host's filler (claim.go)
	side []byte         // the remote's sidecar, stored beside the copy

	mu      sync.Mutex
	cond    *sync.Cond
	state   []segState
	next    int   // the next segment a worker looks at
	err     error // the fill was given up: read from src
	pub     engines.Cursor
	ended   bool // published or given up
	readers int  // miss cursors open
	gone    bool // ended and released: out of the engine's map
	warmers []chan struct{}
	srcOnce sync.Once

	// rw: stage reads hold it shared; the publish holds it exclusively,
	// so that no read is in flight on the stage when it becomes the copy.
	rw sync.RWMutex
}

type segState uint8

const (
	segTodo segState = iota
	segFetching
	segDone
)

var segBufs sync.Pool

// hashBuf is the hasher's read size: the stage's pages are in the page
// cache, so it needs no segment-sized buffer (the daemon's peak memory is
// Parallel segments, whatever the blob's size).
const hashBuf = 1 << 20

func (f *fill) getBuf() *[]byte {
	if bp, ok := segBufs.Get().(*[]byte); ok && int64(cap(*bp)) >= f.e.seg {
		return bp
	}
	b := make([]byte, f.e.seg)
	return &b
}

func (f *fill) segSpan(i int) (off, n int64) {
	off = int64(i) * f.e.seg
	return off, min(f.e.seg, f.size-off)
}

// openMiss reads d through a fill: this process's in flight, or a new one.
// A blob that cannot be cached (empty, over the limit, no room, no stage)
// is read from the remote tier alone.
func (e *Engine) openMiss(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	if c := e.join(d); c != nil {
		return c, nil
	}
	src, err := e.remote.Open(ctx, d)
	if err != nil {
		return nil, err
	}
	size := src.Len()
	if size == 0 || size > e.limit {
		return src, nil
	}
	if c := e.join(d); c != nil {
		src.Close()
		return c, nil
	}
	st, hit, err := e.claim(ctx, d, size)
	switch {
	case hit != nil:
		// Another process of the host filled it meanwhile.
		src.Close()
		return hit, nil
	case err != nil:
		e.fillFailed(d, err)
		return src, nil
	}
	if err := e.makeRoom(ctx, size, size, st.path); err != nil {
		st.discard()
		cause := "local"
		if errors.Is(err, errFull) {
			cause = "full"
		}
		e.count(func(c *counters) { c.fillError(cause) })
		e.log.Info("cache: no room to cache a blob; reading it from the remote tier", "digest", d.String(), "size", size, "err", err)
		return src, nil
	}
	side, _ := remoteSidecar(ctx, e.remote, d)
	f := &fill{e: e, d: d, size: size, src: src, st: st, side: side,
		state: make([]segState, (size+e.seg-1)/e.seg), readers: 1}
	f.cond = sync.NewCond(&f.mu)
	e.mu.Lock()
	if other := e.fills[d]; other != nil {
		// Another Open of d got here first: join it. (Not reached while
		// the claim holds, which excludes this process too; kept for a
		// fill that ended between the join above and the claim.)
		e.mu.Unlock()
		st.discard()
		src.Close()
		if c := e.join(d); c != nil {
			return c, nil
		}
		return e.remote.Open(ctx, d)
	}
	e.fills[d] = f
	e.mu.Unlock()
	f.start()
	return &missCursor{f: f}, nil
}

// join returns a cursor on d's fill in flight, if any.
func (e *Engine) join(d blob.Digest) engines.Cursor {
	e.mu.Lock()
	f := e.fills[d]
	e.mu.Unlock()
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone || f.ended && f.pub == nil {
		return nil // a fill given up is not joined: its readers read the remote
	}
	f.readers++
	return &missCursor{f: f}
}

func (e *Engine) fillFailed(d blob.Digest, err error) {
	cause := "local"
	switch {
	case isNoSpace(err):
		cause = "nospace"
		e.log.Warn("cache: its disk is full; the blob is read from the remote tier", "dir", e.dir, "digest", d.String(), "err", err)
	case errors.Is(err, errRemote):
		cause = "remote"
		e.log.Info("cache: the remote tier failed during a fill; the blob is not cached", "digest", d.String(), "err", err)
	case errors.Is(err, errVerify):
		cause = "verify"
		e.log.Warn("cache: a blob fetched from the remote tier does not hash to its digest; not cached", "digest", d.String(), "err", err)
	case errors.Is(err, errBusy):
		cause = "busy"
		e.log.Info("cache: another process's fill of the blob stalled; reading it from the remote tier", "digest", d.String())
	case errors.Is(err, context.Canceled):
		return
	default:
		e.log.Warn("cache: a fill failed; the blob is read from the remote tier", "digest", d.String(), "err", err)
	}
	e.count(func(c *counters) { c.fillError(cause) })
}

var (
	errRemote = errors.New("remote tier")
	errVerify = errors.New("fetched bytes do not hash to the digest")
)

func (f *fill) start() {
	e := f.e
	e.wg.Add(1 + e.par)
	for range e.par {
		go func() {
			defer e.wg.Done()
			f.work()
		}()
	}
	go func() {
		defer e.wg.Done()
		f.hashAndPublish()
	}()
}

// work fetches unclaimed segments in order until there are none.
func (f *fill) work() {
	for {
		f.mu.Lock()
		for f.next < len(f.state) && f.state[f.next] != segTodo {
			f.next++
		}
		if f.err != nil || f.next >= len(f.state) || f.e.ctx.Err() != nil {
			f.mu.Unlock()
			return
		}
		i := f.next
		f.state[i] = segFetching
		f.mu.Unlock()
		bp := f.getBuf()
		_, err := f.fetch(i, *bp)
		segBufs.Put(bp)
		if err != nil {
			f.fail(err)
			return
		}
	}
}

// fetch reads segment i (claimed by the caller) from the remote into buf,
// writes it to the stage and marks it done. It returns the segment's
// bytes (a prefix of buf) even when only the stage write failed.
func (f *fill) fetch(i int, buf []byte) ([]byte, error) {
	off, n := f.segSpan(i)
	b := buf[:n]
	k, err := f.src.ReadAt(b, off)
	if int64(k) < n {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		f.mu.Lock()
		f.state[i] = segTodo
		f.cond.Broadcast()
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", errRemote, err)
	}
	f.rw.RLock()
	_, werr := f.st.WriteAt(b, off)
	f.rw.RUnlock()
	f.mu.Lock()
	if werr == nil {
		f.state[i] = segDone
	} else {
		f.state[i] = segTodo
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	if werr != nil {
		return b, werr
	}
	f.e.count(func(c *counters) { c.bytesFilled.Add(n) })
	return b, nil
}

// fail gives the fill up (once): the stage is dropped and every reader
// goes to the remote tier.
func (f *fill) fail(err error) {
	f.mu.Lock()
	if f.err != nil || f.ended {
		f.mu.Unlock()
		return
	}
	if f.e.ctx.Err() != nil {
		err = context.Canceled
	}
	f.err = err
	f.cond.Broadcast()
	f.mu.Unlock()
	f.e.fillFailed(f.d, err)
	f.rw.Lock()
	f.st.discard()
	f.rw.Unlock()
	f.end()
}

// hashAndPublish hashes the segments in order as they are done, then
// publishes the stage.
func (f *fill) hashAndPublish() {
	h := sha256.New()
	buf := make([]byte, min(f.e.seg, hashBuf)) // from the page cache: small reads are as fast
	for i := range f.state {
		f.mu.Lock()
		for f.state[i] != segDone && f.err == nil && f.e.ctx.Err() == nil {
			f.cond.Wait()
		}
		err := f.err
		f.mu.Unlock()
		if err != nil {
			return
		}
		if f.e.ctx.Err() != nil {
			f.fail(context.Canceled)
			return
		}
		off, n := f.segSpan(i)
		for end := off + n; off < end; {
			p := buf[:min(int64(len(buf)), end-off)]
			f.rw.RLock()
			k, rerr := f.st.ReadAt(p, off)
			f.rw.RUnlock()
			if k < len(p) {
				f.fail(fmt.Errorf("read the stage back: %w", rerr))
				return
			}
			h.Write(p)
			off += int64(k)
		}
	}
	var got blob.Digest
	h.Sum(got[:0])
	if got != f.d {
		f.fail(fmt.Errorf("%w: they hash to %s", errVerify, got))
		return
	}
	f.publish()
}

func (f *fill) publish() {
	e := f.e
	ctx, cancel := context.WithTimeout(context.Background(), 5*60e9)
	defer cancel()
	f.rw.Lock()
	defer f.rw.Unlock()
	unlock, err := e.lock(unix.LOCK_SH)
	if err != nil {
		f.st.discard()
		f.failLocked(err)
		return
	}
	linked, id, err := f.st.publish(ctx, e, f.d, f.side, f.size)
	unlock()
	if err != nil && !linked {
		f.failLocked(err)
		return
	}
	if err != nil {
		e.log.Warn("cache: a copy was published but may not be durable", "digest", f.d.String(), "err", err)
	}
	pub, err := e.loc.Open(ctx, f.d)
	if err == nil && linked && id != (engines.FileID{}) {
		// The copy is the file this fill hashed whole to its digest: known
		// good as it is now, as after a read that checked it whole, so a
		// mount under --verify=full passes it through from its next open.
		// Only if the name still leads to that very file, unchanged.
		if now, ok := engines.CursorFileID(pub); ok && now == id {
			e.verified(f.d, id)
		}
	}
	f.mu.Lock()
	if err != nil {
		f.err = err // published, but not readable here: readers go remote
	} else {
		f.pub = pub
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	if linked {
		e.count(func(c *counters) { c.fills.Add(1) })
	}
	f.end()
}

// failLocked is fail with f.rw held and the stage ended.
func (f *fill) failLocked(err error) {
	f.mu.Lock()
	f.err = err
	f.cond.Broadcast()
	f.mu.Unlock()
	f.e.fillFailed(f.d, err)
	f.end()
}

// end marks the fill ended: it leaves the engine's map once no reader
// needs it, and wakes the warmers.
func (f *fill) end() {
	f.mu.Lock()
	f.ended = true
	ws := f.warmers
	f.warmers = nil
	f.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
	f.release(0)
}

// release drops n readers, and the fill's resources once it has ended and
// no reader is left.
func (f *fill) release(n int) {
	f.mu.Lock()
	f.readers -= n
	last := f.ended && f.readers == 0
	pub := f.pub
	if last {
		f.pub, f.gone = nil, true
	}
	f.mu.Unlock()
	if !last {
		return
	}
	f.e.mu.Lock()
	if f.e.fills[f.d] == f {
		delete(f.e.fills, f.d)
	}
	f.e.mu.Unlock()
	f.closeSrc()
	if pub != nil {
		pub.Close()
	}
}

// missCursor reads a blob through its fill.
type missCursor struct {
	f      *fill
	once   sync.Once
	closed bool
}

func (m *missCursor) Len() int64 { return m.f.size }

func (m *missCursor) Close() error {
	m.once.Do(func() { m.f.release(1) })
	return nil
}

func (m *missCursor) ReadAt(p []byte, off int64) (int, error) {
	return engines.ReadAtSized(p, off, m.f.size, m.f.read)
}

// read fills a prefix of p from off < size: from the published copy, from
// a done segment of the stage, from the remote tier once the fill was
// given up; or it waits for a segment being fetched, or fetches one no one
// has started.
func (f *fill) read(p []byte, off int64) (int, error) {
	i := int(off / f.e.seg)
	segOff, segN := f.segSpan(i)
	want := p[:min(int64(len(p)), segOff+segN-off)]
	for {
		f.mu.Lock()
		switch {
		case f.pub != nil:
			pub := f.pub
			f.mu.Unlock()
			return pub.ReadAt(p, off)
		case f.err != nil:
			f.mu.Unlock()
			return f.src.ReadAt(p, off)
		case f.state[i] == segDone:
			f.mu.Unlock()
			f.rw.RLock()
			f.mu.Lock() // pub and err change under mu (fail, publish)
			ended := f.pub != nil || f.err != nil
			f.mu.Unlock()
			if ended {
				f.rw.RUnlock()
				continue
			}
			n, err := f.st.ReadAt(want, off)
			f.rw.RUnlock()
			if n == len(want) {
				return n, nil
			}
			// The stage ended under us (a failure): read from the remote.
			_ = err
			return f.src.ReadAt(p, off)
		case f.state[i] == segFetching:
			f.cond.Wait()
			f.mu.Unlock()
		default:
			f.state[i] = segFetching
			f.mu.Unlock()
			bp := f.getBuf()
			b, err := f.fetch(i, *bp)
			if err != nil && b == nil {
				segBufs.Put(bp)
				f.fail(err)
				return 0, err
			}
			if err != nil {
				f.fail(err) // the stage write failed; the bytes are good
			}
			n := copy(want, b[off-segOff:])
			segBufs.Put(bp)
			return n, nil
		}
	}
}

// Warm implements engines.Cache: d is fetched into the cache unless it is
// there already, and Warm returns once it is (or the fill failed).
func (e *Engine) Warm(ctx context.Context, d blob.Digest, progress func(done int64)) error {
	if c, ok := e.openHit(ctx, d); ok {
		// Warming vouches for the copy: one read of it, against the
		// digest, so that a damaged copy is replaced now and not found
		// by a reader later.
		err := checkWhole(c, d)
		c.Close()
		if err == nil {
			if progress != nil {
				progress(c.Len())
			}
			return nil
		}
		if !errors.Is(err, errDamaged) {
			// The medium failed to deliver the bytes (a transient EIO):
			// the copy may be fine, so it is kept and Warm fails.
			return fmt.Errorf("blob %s: reading its cached copy: %w", d, err)
		}
		e.log.Warn("cached copy of a blob failed verification; dropping it and reading the blob from the remote tier again",
			"digest", d.String(), "dir", e.dir, "err", err)
		e.dropLocal(ctx, d, true)
	}
	c, err := e.openMiss(ctx, d)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, ok := c.(*hitCursor); ok { // another process filled it
		if progress != nil {
			progress(c.Len())
		}
		return nil
	}
	m, ok := c.(*missCursor)
	if !ok {
		return fmt.Errorf("blob %s (%d bytes) cannot be cached: it is empty, larger than the cache, or the cache has no room", d, c.Len())
	}
	f := m.f
	done := make(chan struct{})
	f.mu.Lock()
	if f.ended {
		close(done)
	} else {
		f.warmers = append(f.warmers, done)
	}
	f.mu.Unlock()
	tick := newTicker()
	defer tick.Stop()
	for {
		select {
		case <-done:
			f.mu.Lock()
			err := f.err
			f.mu.Unlock()
			if err != nil {
				return fmt.Errorf("cache %s: %w", d, err)
			}
			if progress != nil {
				progress(f.size)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if progress != nil {
				progress(f.doneBytes())
			}
		}
	}
}

func (f *fill) doneBytes() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for i, s := range f.state {
		if s == segDone {
			_, k := f.segSpan(i)
			n += k
		}
	}
	return n
}

func (f *fill) closeSrc() { f.srcOnce.Do(func() { f.src.Close() }) }

// checkWhole reads c from 0 to its end and compares its hash with d.
func checkWhole(c engines.Cursor, d blob.Digest) error {
	h := sha256.New()
	buf := make([]byte, hashBuf)
	for off := int64(0); off < c.Len(); {
		p := buf[:min(int64(len(buf)), c.Len()-off)]
		k, err := c.ReadAt(p, off)
		h.Write(p[:k])
		off += int64(k)
		if k < len(p) {
			if err == nil || errors.Is(err, io.EOF) {
				return fmt.Errorf("%w: the copy ends at %d, want %d bytes", errDamaged, off, c.Len())
			}
			return fmt.Errorf("read at %d: %w", off, err)
		}
	}
	var got blob.Digest
	h.Sum(got[:0])
	if got != d {
		return fmt.Errorf("%w: the copy hashes to %s", errDamaged, got)
	}
	return nil
}

// errDamaged: checkWhole found the copy's bytes wrong (they hash to
// another digest, or end early), not merely unreadable.
var errDamaged = errors.New("cached copy is damaged")
