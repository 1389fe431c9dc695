package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// verifier checks a large blob's range reads. With chunk checksums it
// reads whole chunks and checks each one it touches; without them (no
// sidecar: an engine that keeps none, or a sidecar lost in a crash) the
// first read hashes the whole blob and compares before serving anything:
// a sha256 proves nothing about a prefix until it reaches EOF. That costs
// one sequential pass, once per reader, and only for such blobs.
type verifier struct {
	r    *Reader
	e    engines.Engine
	sums chunkSums // nil: prefix form

	// after is the verifier of the bytes a cache's cursor serves once it
	// dropped its copy (refetched): with the remote tier's checksums, as
	// the copy's own may be what was damaged.
	after atomic.Pointer[verifier]

	// chunk form: which chunks have been checked, for full().
	checked []atomic.Uint64
	left    atomic.Int64

	// sumsBad: the checksums failed a chunk of content that hashes whole
	// to its digest (sumsWrong): the whole-blob form serves from then on.
	sumsBad atomic.Bool

	// whole-blob form.
	mu   sync.Mutex
	bad  error // sticky verification failure
	good atomic.Bool
}

func newVerifier(ctx context.Context, r *Reader, e engines.Engine) *verifier {
	v := &verifier{r: r, e: e}
	if sr, ok := e.(engines.SidecarReader); ok {
		b, err := sr.Sidecar(ctx, r.d)
		switch {
		case err == nil:
			sums, perr := parseSums(b, r.size)
			if perr == nil {
				v.sums = sums
			} else {
				r.s.log.Warn("ignoring chunk checksums; verifying from offset 0", "digest", r.d, "engine", r.engine, "err", perr)
			}
		case !errors.Is(err, ErrMissing):
			r.s.log.Warn("reading chunk checksums; verifying from offset 0", "digest", r.d, "engine", r.engine, "err", err)
		}
	}
	if v.sums != nil {
		if right := r.s.rightSums.get(r.d); right != nil && len(right) == len(v.sums) {
			v.sums = right // the stored ones were found damaged (hashAll)
		}
	}
	if v.sums != nil {
		v.checked = make([]atomic.Uint64, (len(v.sums)+63)/64)
		v.left.Store(int64(len(v.sums)))
	}
	if r.size == 0 {
		v.good.Store(true)
	}
	return v
}

// refetched starts verifying with the remote tier's checksums, once.
func (v *verifier) refetched() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.after.Load() != nil {
		return
	}
	// Not the reader's context: the mount's is its OPEN request's, over.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v.after.Store(newVerifier(engines.Direct(ctx), v.r, v.e))
}

func (v *verifier) full() bool {
	if nv := v.after.Load(); nv != nil {
		return nv.full()
	}
	if v.sums != nil && !v.sumsBad.Load() {
		return v.left.Load() == 0
	}
	return v.good.Load()
}

// sumsWrong reports, after a chunk failed its checksum, whether the
// blob's content is good as a whole (it hashes to its digest): then the
// checksums, not the content, are damaged, and the blob is served in the
// whole-blob form. It costs one read of the blob, on a failure only.
func (v *verifier) sumsWrong() bool {
	if nv := v.after.Load(); nv != nil {
		return nv.sumsWrong()
	}
	if v.sums == nil || v.hashAll() != nil {
		return false
	}
	if !v.sumsBad.Swap(true) {
		v.r.s.log.Warn("a blob's chunk checksums are damaged, its content is intact; verifying it whole instead",
			"digest", v.r.d.String(), "engine", v.r.engine)
	}
	return true
}

// wholeBad is the failure of the whole-blob hash of the verifier that
// serves now (nil if it did not fail), and whether that verifier reads
// the remote tier after a cache's copy was dropped.
func (v *verifier) wholeBad() (bad error, refetched bool) {
	if nv := v.after.Load(); nv != nil {
		bad, _ := nv.wholeBad()
		return bad, true
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.bad, false
}

func (v *verifier) readAt(p []byte, off int64) (int, error) {
	if nv := v.after.Load(); nv != nil {
		return nv.readAt(p, off)
	}
	if off >= v.r.size {
		return 0, io.EOF
	}
	if v.sums == nil || v.sumsBad.Load() {
		if err := v.hashAll(); err != nil {
			return 0, err
		}
		// Uncounted, as readChunks: ReadAt and Read count what they
		// hand out.
		n, err := v.r.cur.ReadAt(p, off)
		if err != nil && !errors.Is(err, io.EOF) {
			err = blob.Wrap("read", v.r.engine, v.r.d, err)
		}
		return n, err
	}
	return v.readChunks(p, off)
}

// readChunks reads the chunk-aligned span covering [off, off+len(p)) and
// checks every chunk in it before copying out.
func (v *verifier) readChunks(p []byte, off int64) (int, error) {
	r := v.r
	end := min(r.size, off+int64(len(p)))
	first, last := off/chunkSize, (end-1)/chunkSize
	spanOff := first * chunkSize
	spanEnd := min(r.size, (last+1)*chunkSize)
	span := p
	aligned := spanOff == off && spanEnd == end
	if !aligned {
		bp := spanBufs.Get().(*[]byte)
		defer spanBufs.Put(bp)
		if int64(cap(*bp)) < spanEnd-spanOff {
			*bp = make([]byte, spanEnd-spanOff)
		}
		span = (*bp)[:spanEnd-spanOff]
	} else {
		span = p[:end-off]
	}
	n, err := r.cur.ReadAt(span, spanOff)
	if int64(n) < spanEnd-spanOff {
		return 0, blob.Wrap("read", r.engine, r.d, fmt.Errorf("at %d: %w", spanOff, r.shortErr(err)))
	}
	for i := first; i <= last; i++ {
		lo := (i - first) * chunkSize
		hi := min(lo+chunkSize, int64(len(span)))
		if !v.sums.check(i, span[lo:hi]) {
			return 0, blob.Wrap("read", r.engine, r.d, fmt.Errorf("%w: chunk at offset %d fails its checksum", ErrVerification, i*chunkSize))
		}
		v.mark(i)
	}
	if v.left.Load() == 0 {
		r.verifiedWhole()
	}
	if !aligned {
		copy(p, span[off-spanOff:end-spanOff])
	}
	if end-off < int64(len(p)) {
		return int(end - off), io.EOF
	}
	return int(end - off), nil
}

func (v *verifier) mark(i int64) {
	w, bit := &v.checked[i/64], uint64(1)<<(i%64)
	for {
		old := w.Load()
		if old&bit != 0 {
			return
		}
		if w.CompareAndSwap(old, old|bit) {
			v.left.Add(-1)
			return
		}
	}
}

// hashAll hashes the blob from offset 0 to EOF and compares, once; the
// verdict is kept for later reads.
func (v *verifier) hashAll() error {
	if v.good.Load() {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.good.Load() {
		return nil
	}
	if v.bad != nil {
		return v.bad
	}
	r := v.r
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	// The chunk checksums too (CRC-32C, at memory speed), for blobs whose
	// own are damaged: see rightSums.
	h := newContentHash()
	for off := int64(0); off < r.size; {
		k := min(int64(len(*bp)), r.size-off)
		n, err := r.cur.ReadAt((*bp)[:k], off)
		h.Write((*bp)[:n])
		off += int64(n)
		if int64(n) < k {
			return blob.Wrap("read", r.engine, r.d, fmt.Errorf("at %d: %w", off, r.shortErr(err)))
		}
	}
	if got := h.digest(); got != r.d {
		v.bad = blob.Wrap("read", r.engine, r.d, fmt.Errorf("%w: content hashes to %s", ErrVerification, got))
		return v.bad
	}
	v.good.Store(true)
	if v.sums != nil {
		// The blob's checksums failed content that hashes whole to its
		// digest (sumsWrong): keep the right ones, computed from that
		// content, so that the next readers check chunks with them
		// instead of failing a chunk and hashing the whole blob again.
		if sums, err := parseSums(h.sidecar(), r.size); err == nil {
			r.s.rightSums.put(r.d, sums)
		}
	}
	r.verifiedWhole()
	return nil
}

// rightSums keeps, in the process, the chunk checksums computed from the
// content of blobs whose stored checksums were found damaged (their
// content hashed whole to the digest). Design point (the simplest safe
// bound on the cost of damaged checksums): checksums computed from
// content that hashes to d are the right ones for d whatever holds it
// (another file, another tier), so a reader may check its chunks with
// them instead of the stored ones: every byte it serves is still checked
// (bit rot since then fails them, and a failure hashes the blob whole,
// which then marks it corrupt). Rewriting the stored sidecar would need a
// new put of the whole blob; the engines have no way to replace a
// sidecar alone. Bounded: when full it starts over, which costs one more
// whole hash, never an unchecked byte.
type rightSums struct {
	mu   sync.Mutex
	sums map[Digest]chunkSums
}

const rightSumsMax = 64

func (rs *rightSums) put(d Digest, s chunkSums) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.sums == nil || len(rs.sums) >= rightSumsMax {
		rs.sums = make(map[Digest]chunkSums)
	}
	rs.sums[d] = s
}

func (rs *rightSums) get(d Digest) chunkSums {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.sums[d]
}

// shortErr is the error of a read that ended before the blob does. On a
// cache's local copy (an engines.Refetcher cursor still reading its file)
// a short read is damage, the copy truncated after it was opened: it wraps
// ErrVerification, so that the reader drops the copy and reads the remote
// tier once (verifiedReadAt), as for a chunk that fails its check. A short
// read of anything else stays io.ErrUnexpectedEOF.
func (r *Reader) shortErr(err error) error {
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if _, ok := r.cur.(engines.Refetcher); ok {
		if _, local := cursorFile(r.cur); local {
			return fmt.Errorf("%w: the cached copy ends early (%w)", ErrVerification, io.ErrUnexpectedEOF)
		}
	}
	return io.ErrUnexpectedEOF
}

var spanBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2*chunkSize); return &b }}
