package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// Reader reads one blob and never returns wrong bytes as good.
//
// Read streams from offset 0 and verifies as ReadAt does, chunk by chunk
// before any byte of a chunk is returned, and at EOF: if the content does
// not hash to the digest, Read returns an error wrapping ErrVerification
// instead of io.EOF (after Trust, that is its only check). ReadAt verifies too: kv blobs are materialized and
// checked at open; a large blob's range reads check the 64 KiB chunks they
// touch against the checksums recorded at publish, or, for a blob without
// them, hash the blob from offset 0 up to the end of the range first (see
// verifier). Trust turns range verification off. Close releases the
// cursor.
type Reader struct {
	s      *Store
	d      Digest
	tier   Tier
	engine string
	cur    engines.Cursor
	size   int64

	pos  int64     // next Read offset
	h    hash.Hash // nil once verified (kv) or once EOF checked
	pipe *hashPipe // feeds h off the reading goroutine; started by Read
	err  error     // sticky result after EOF

	v       *verifier // range verification of large blobs; nil for kv
	trusted bool      // Trust was called

	// What the store knows of the blob as its file is now (verdicts.go),
	// set by judge at Get and at each Recheck, under jmu.
	jmu      sync.Mutex
	fileNow  engines.FileID // the backing file's identity when judged
	isFile   bool           // the blob is a local file
	suspect  bool           // marked corrupt as another version of its file
	good     bool           // verified end to end as this very file
	changed  bool           // a verdict was about another version of the file
	markFile []byte         // a suspect blob's mark, cleared once verified
	whole    atomic.Bool    // verifiedWhole ran
	marked   atomic.Bool    // markCorrupt ran
}

// Get opens d for reading. A miss is ok=false, unless a namespace links
// d: then it is lost (lost.go), an error wrapping ErrLost. A blob a scrub found
// corrupt (in any process that shares the store) is refused with an error
// wrapping ErrCorrupt and ErrVerification, until it is repaired (see
// verdicts.go); one whose file changed since is served verified only.
func (s *Store) Get(ctx context.Context, d Digest) (*Reader, bool, error) {
	return s.open(ctx, d, true)
}

// open is Get; judge false skips the verdicts (a scrub reads a blob to
// judge it).
func (s *Store) open(ctx context.Context, d Digest, judge bool) (*Reader, bool, error) {
	if s.closed.Load() {
		return nil, false, ErrClosed
	}
	if !judge {
		// A scrub checks the pool, not this host's cache of it.
		ctx = engines.Direct(ctx)
	}
	r, ok, err := s.openTiers(ctx, d, judge)
	if ok || err != nil || !judge {
		return r, ok, err
	}
	if testHookMissed != nil {
		testHookMissed(d)
	}
	again, err := s.lostErr(ctx, "get", d)
	if err != nil || !again {
		return nil, false, err
	}
	return s.openTiers(ctx, d, judge) // put since the miss (lostErr)
}

// openTiers opens d from the first tier that holds it; ok is false when
// none does.
func (s *Store) openTiers(ctx context.Context, d Digest, judge bool) (*Reader, bool, error) {
	for _, t := range s.tiers() {
		cur, err := t.e.Open(ctx, d)
		if errors.Is(err, ErrMissing) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		r := &Reader{s: s, d: d, tier: t.tier, engine: t.e.Name(), cur: cur, size: cur.Len(), h: sha256.New()}
		if t.tier == TierKV {
			if err := r.materialize(); err != nil {
				cur.Close()
				return nil, false, err
			}
		} else {
			// kv blobs need no verdict: each Get verifies them whole.
			if judge {
				if err := r.judge(ctx); err != nil {
					cur.Close()
					return nil, false, err
				}
			}
			r.v = newVerifier(ctx, r, t.e)
		}
		s.stats.reads.Add(1)
		return r, true, nil
	}
	return nil, false, nil
}

// materialize reads a kv blob whole and verifies it.
func (r *Reader) materialize() error {
	buf := make([]byte, r.size)
	n, err := r.cur.ReadAt(buf, 0)
	if int64(n) != r.size {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return blob.Wrap("read", r.engine, r.d, err)
	}
	if got := blob.Sum(buf); got != r.d {
		// Known corrupt now, as a scrub would find it: the same refusal
		// as a marked large blob's, naming no engine (verdicts.go).
		r.s.log.Debug("blob's stored value does not match its digest; refusing to serve it", "digest", r.d.String(), "engine", r.engine, "hashes_to", got.String())
		return blob.Wrap("get", "", r.d, fmt.Errorf("%w (%w): its stored value hashes to %s", ErrCorrupt, ErrVerification, got))
	}
	r.cur.Close()
	r.cur = engines.BytesCursor(buf)
	r.h = nil
	return nil
}

// Digest is the blob's key.
func (r *Reader) Digest() Digest { return r.d }

// Tier is the tier that holds the blob.
func (r *Reader) Tier() Tier { return r.tier }

// Len is the blob's size.
func (r *Reader) Len() int64 { return r.size }

// Passthrough returns the descriptor of the blob's backing file when the
// bytes may be read from it directly, bypassing verification (FUSE
// passthrough, a splice): the blob is a local file, not suspect, and
// either the reader is trusted (Trust) or the blob is known good as the
// file it is now. The descriptor is the reader's, valid until Close; ok is
// false otherwise.
func (r *Reader) Passthrough() (fd uintptr, ok bool) {
	fc, isFile := r.cur.(engines.FileCursor)
	if !isFile {
		return 0, false
	}
	r.jmu.Lock()
	defer r.jmu.Unlock()
	if r.suspect || !r.trusted && !r.good {
		return 0, false
	}
	if _, ok := cursorFile(r.cur); !ok {
		return 0, false // a cache's copy dropped since (engines.Refetcher)
	}
	return fc.File().Fd(), true
}

// Recheck judges a reader kept open across uses (the mount shares one
// between the handles of a blob) again, as Get did: its file may have
// changed, or a scrub (in any process) found it corrupt since. It returns
// Get's refusal for a corrupt blob.
func (r *Reader) Recheck(ctx context.Context) error {
	if r.tier != TierLarge {
		return nil
	}
	r.jmu.Lock()
	defer r.jmu.Unlock()
	return r.judge(ctx)
}

// Changed reports that, when Get or the last Recheck judged it, the blob's
// file had changed since a verdict about it (it is then verified again).
func (r *Reader) Changed() bool {
	r.jmu.Lock()
	defer r.jmu.Unlock()
	return r.changed
}

// Read implements io.Reader, verified (see the type doc).
func (r *Reader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, r.eof()
	}
	if int64(len(p)) > r.size-r.pos {
		p = p[:r.size-r.pos]
	}
	var n int
	var err error
	if r.v != nil {
		// Through the verifier, as ReadAt: no byte of a chunk leaves
		// before its checksum passed (and a cache's bad copy is read
		// again from the remote tier), so that a stream's reader never
		// writes out what the hash at EOF would only then refuse.
		n, err = r.verifiedReadAt(p, r.pos)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err // wrapped already; nothing of the span is given
		}
	} else {
		n, err = r.cur.ReadAt(p, r.pos)
	}
	if r.h != nil {
		if r.pipe == nil {
			r.pipe = newHashPipe(r.h)
		}
		r.pipe.Write(p[:n])
	}
	r.pos += int64(n)
	r.s.stats.bytesOut.Add(int64(n))
	if err != nil && !errors.Is(err, io.EOF) {
		return n, blob.Wrap("read", r.engine, r.d, err)
	}
	if r.pos >= r.size {
		if err := r.eof(); err != io.EOF {
			return n, err
		}
		return n, nil
	}
	if n == 0 {
		return 0, blob.Wrap("read", r.engine, r.d, fmt.Errorf("blob ends at %d, want %d: %w", r.pos, r.size, io.ErrUnexpectedEOF))
	}
	return n, nil
}

func (r *Reader) eof() error {
	if r.h != nil {
		if r.pipe != nil {
			r.pipe.wait()
		}
		var got Digest
		r.h.Sum(got[:0])
		r.h = nil
		if got != r.d {
			r.err = blob.Wrap("read", r.engine, r.d, fmt.Errorf("%w: content hashes to %s", ErrVerification, got))
			r.refetch() // a cache's copy: dropped, so that the next Get fetches it again
		} else {
			r.verifiedWhole()
		}
	}
	if r.err != nil {
		return r.err
	}
	return io.EOF
}

// WriteTo streams the rest of the blob to w with large reads; it returns the
// verification error at the end, if any.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	var total int64
	for {
		n, err := r.Read(*bp)
		if n > 0 {
			m, werr := w.Write((*bp)[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// ReadAt reads at off, verified (see the type doc).
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	if r.v != nil {
		n, err := r.verifiedReadAt(p, off)
		r.s.stats.bytesOut.Add(int64(n))
		return n, err
	}
	return r.rawReadAt(p, off)
}

// verifiedReadAt is ReadAt through the verifier, uncounted. A chunk that
// fails its check on a cache's copy drops the copy (refetch) and is read
// once more, from the remote tier; one that still fails is read once
// more if the blob's content is intact and its checksums are not.
func (r *Reader) verifiedReadAt(p []byte, off int64) (int, error) {
	n, err := r.v.readAt(p, off)
	if err != nil && errors.Is(err, ErrVerification) && r.refetch() {
		r.v.refetched()
		n, err = r.v.readAt(p, off) // from the remote tier now
	}
	if err != nil && errors.Is(err, ErrVerification) && r.v.sumsWrong() {
		n, err = r.v.readAt(p, off)
	}
	if err != nil && errors.Is(err, ErrVerification) {
		if bad, refetched := r.v.wholeBad(); bad != nil {
			r.markCorrupt(bad, refetched)
		}
	}
	return n, err
}

// markCorrupt records in the ledger what a whole hash of the blob found
// (verifier.wholeBad), as a scrub would (recordScrub): the next Get, in
// any process sharing the store, refuses the blob up front instead of
// hashing all of it again before it answers. The verdict is about the
// file as judge saw it; one that changed while it was hashed records
// nothing. After a refetch the bytes were the remote tier's: the verdict
// is about no local file.
func (r *Reader) markCorrupt(bad error, refetched bool) {
	if r.tier != TierLarge || r.marked.Swap(true) {
		return
	}
	id, isFile := cursorFile(r.cur)
	if !refetched {
		r.jmu.Lock()
		was, wasFile := r.fileNow, r.isFile
		r.jmu.Unlock()
		if isFile != wasFile || isFile && id != was {
			return
		}
	} else {
		id, isFile = engines.FileID{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.s.verdicts.forget(r.d)
	if err := r.s.ledger.mark(ctx, r.d, fileIdent(id, isFile), bad.Error()); err != nil {
		r.s.log.Error("a read found a blob corrupt but could not record it; other readers will hash it again", "digest", r.d.String(), "err", err)
		return
	}
	// Debug: the read's error says it all, and each surface reports it
	// its own way (as judge's refusals).
	r.s.log.Debug("a read found a blob corrupt; it is refused from now on, until the right content is put again", "digest", r.d.String(), "engine", r.engine)
}

// Trust turns off range verification for this reader: ReadAt returns the
// stored bytes as they are (the mount's --verify=publish). Sequential
// Read still verifies at EOF. A suspect blob (found corrupt, its file
// changed since) is not trusted: Trust does nothing until it verifies
// good.
func (r *Reader) Trust() {
	r.jmu.Lock()
	defer r.jmu.Unlock()
	if r.suspect {
		return
	}
	r.v, r.trusted = nil, true
}

// Trusted reports whether Trust turned range verification off.
func (r *Reader) Trusted() bool {
	r.jmu.Lock()
	defer r.jmu.Unlock()
	return r.trusted
}

// FullyVerified reports whether every byte of the blob has been checked by
// this reader (or at open, for kv blobs): from then on, serving the stored
// bytes directly (FUSE passthrough) cannot hand out unchecked content.
func (r *Reader) FullyVerified() bool {
	if r.tier == TierKV {
		return true
	}
	return r.v != nil && r.v.full()
}

func (r *Reader) rawReadAt(p []byte, off int64) (int, error) {
	n, err := r.cur.ReadAt(p, off)
	r.s.stats.bytesOut.Add(int64(n))
	if err != nil && !errors.Is(err, io.EOF) {
		err = blob.Wrap("read", r.engine, r.d, err)
	}
	return n, err
}

// Close releases the cursor (and the hashing goroutine of a Read that
// stopped before EOF).
func (r *Reader) Close() error {
	if r.pipe != nil {
		r.pipe.wait()
	}
	return r.cur.Close()
}

// MaxReadRange bounds one ReadRange, which returns the range in memory
// (with its own digest): larger ranges are read in parts or streamed.
const MaxReadRange = 64 << 20

// ReadRange returns n bytes of d from off (fewer at EOF) and the sha256 of
// the returned slice. An absent key returns ErrMissing; a range over
// MaxReadRange (after clipping at EOF) returns ErrTooLarge.
func (s *Store) ReadRange(ctx context.Context, d Digest, off, n int64) ([]byte, Digest, error) {
	if off < 0 || n < 0 {
		return nil, Digest{}, fmt.Errorf("read range %s: negative offset or length (%d, %d)", d, off, n)
	}
	r, ok, err := s.Get(ctx, d)
	if err != nil {
		return nil, Digest{}, err
	}
	if !ok {
		return nil, Digest{}, blob.Wrap("read", "", d, ErrMissing)
	}
	defer r.Close()
	if off >= r.size {
		return []byte{}, blob.Sum(nil), nil
	}
	n = min(n, r.size-off)
	if n > MaxReadRange {
		return nil, Digest{}, blob.Wrap("read", r.engine, d, fmt.Errorf("%w: a range of %d bytes is over the %d-byte limit of one range read; read it in parts, or stream it with Get", ErrTooLarge, n, MaxReadRange))
	}
	buf := make([]byte, n)
	k, err := r.ReadAt(buf, off)
	if int64(k) != n {
		if err == nil || errors.Is(err, io.EOF) {
			err = blob.Wrap("read", r.engine, d, io.ErrUnexpectedEOF)
		}
		return nil, Digest{}, err
	}
	return buf, blob.Sum(buf), nil
}
