package store

import (
	"io"
	"sync"
	"sync/atomic"
)

// stageWriter writes an upload's sequential appends (or a put's content)
// into its stage on its own goroutine, beside the hash pipe's: a write
// into the upload only copies its bytes into a buffer that both read, and
// returns.
//
// Why: the mount's writes into incoming/ come one at a time (the kernel
// sends the next when the last is answered), so everything done before
// the answer is paid once per request, in series with the writer's own
// copies, while the hash runs on the other core. One copy of the request
// (about 0.1 s per GiB) now stands for the write into the stage file
// (about 0.3 s per GiB, plus the writeback the stage starts) and the copy
// the hash pipe made: that chain is then about as long as the sha256, and
// a 1 GiB cp costs about the longer of the two instead of their sum.
//
// A failed write is kept, and reported by the next call that waits for the
// writes (wait, stop) or asks (failed): the caller's upload then fails, so
// content with a missing write is never published. At most pipeDepth
// buffers are queued, so a slow stage holds the writer back instead of
// growing memory.
type stageWriter struct {
	st      io.WriterAt
	sums    *contentHash // fed the chunk checksums of what is written, if set
	ch      chan stageItem
	done    chan struct{}
	pending sync.WaitGroup // writes queued and not yet done
	mu      sync.Mutex
	err     error // the first failed write; the later ones are skipped
	shut    bool
}

// stageItem is b's bytes, to be written at off.
type stageItem struct {
	b   *sharedBuf
	off int64
}

// sharedBuf is the first n bytes of a copyBufs buffer, read by the hash
// pipe and, for a stage writer's items, the stage writer too: it goes back
// to the pool when the last of its refs readers releases it.
type sharedBuf struct {
	bp   *[]byte
	n    int
	refs atomic.Int32
}

func newSharedBuf(bp *[]byte, n int, refs int32) *sharedBuf {
	b := &sharedBuf{bp: bp, n: n}
	b.refs.Store(refs)
	return b
}

func (b *sharedBuf) bytes() []byte { return (*b.bp)[:b.n] }

func (b *sharedBuf) release() {
	if b.refs.Add(-1) == 0 {
		copyBufs.Put(b.bp)
	}
}

// newStageWriter starts a writer into st. With sums set, it also computes
// the chunk checksums of what it writes into sums (writeSums), so that the
// hash pipe computes the sha256 alone (shaOnly).
func newStageWriter(st io.WriterAt, sums *contentHash) *stageWriter {
	w := &stageWriter{st: st, sums: sums, ch: make(chan stageItem, pipeDepth), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *stageWriter) run() {
	defer close(w.done)
	for it := range w.ch {
		if w.failed() == nil {
			p := it.b.bytes()
			n, err := w.st.WriteAt(p, it.off)
			if err == nil && n < len(p) {
				err = io.ErrShortWrite
			}
			if err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
			} else if w.sums != nil {
				w.sums.writeSums(p)
			}
		}
		it.b.release()
		w.pending.Done()
	}
}

// append queues p for the stage at off and hands the same bytes to pipe,
// whose hash must be at off. It copies p (callers reuse their buffers)
// and blocks only when the stage or the hash is pipeDepth MiB behind.
func (w *stageWriter) append(p []byte, off int64, pipe *hashPipe) {
	for len(p) > 0 {
		bp := copyBufs.Get().(*[]byte)
		n := copy(*bp, p)
		w.give(bp, n, off, pipe)
		p, off = p[n:], off+int64(n)
	}
}

// give is append of the first n bytes of *bp, a buffer of copyBufs that
// the caller hands over instead of copying from.
func (w *stageWriter) give(bp *[]byte, n int, off int64, pipe *hashPipe) {
	b := newSharedBuf(bp, n, 2)
	w.pending.Add(1)
	w.ch <- stageItem{b: b, off: off}
	pipe.share(b)
}

// failed returns the first failed write so far, without waiting.
func (w *stageWriter) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// wait returns once every queued write is done, with the first that
// failed.
func (w *stageWriter) wait() error {
	w.pending.Wait()
	return w.failed()
}

// stop waits like wait and ends the goroutine. Idempotent; no append may
// follow.
func (w *stageWriter) stop() error {
	if !w.shut {
		w.shut = true
		close(w.ch)
	}
	<-w.done
	return w.failed()
}

// appender is a sequential stage as the stage writer's io.WriterAt: the
// writer writes its items in the order they were queued, so a put that
// queues consecutive offsets from 0 writes each at the stage's end.
type appender struct{ w io.Writer }

func (a appender) WriteAt(p []byte, off int64) (int, error) { return a.w.Write(p) }
