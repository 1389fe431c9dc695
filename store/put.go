package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Pin is an in-process reference that keeps a blob from being swept.
type Pin = gc.Pin

// Linker writes a put's namespace part (meta.NSRows) where the kv engine
// cannot commit it with the entry — an engine that is no meta.Putter, or
// a large put: after publish, in a transaction of its own, while the
// put's pin protects the entry. *namespaces.Service is one (CommitRows).
type Linker interface {
	CommitRows(ctx context.Context, rows meta.NSRows) error
}

// PutOption adjusts one put.
type PutOption func(*putOptions)

type putOptions struct {
	// ns is the put's namespace part, and linker what writes it apart
	// from the entry (WithLink); nil: the put links nothing.
	ns     meta.NSRows
	linker Linker
	// releasesPin: the caller releases the put's pin as soon as the put
	// returns (ReleasesPinAtOnce).
	releasesPin bool
	// local is a file holding the put's content, which the large tier's
	// cache may adopt once the put has committed (put_cache.go).
	local *os.File
}

// WithLink commits ns, a namespace part without its digest and size
// (namespaces.Service's LinkRows, SettleRows, PendRows), with the put:
// in the entry's transaction where the kv engine can join them
// (meta.Putter), so that the entry and its link or intent commit
// together or not at all; otherwise right after publish, through l. Its
// rows must keep the digest live to every process's sweeps (a reference
// or an intent). If they fail (a quota, a namespace removed), the put
// fails, and in the joint form nothing commits.
func WithLink(l Linker, ns meta.NSRows) PutOption {
	return func(o *putOptions) { o.linker, o.ns = l, ns }
}

// ReleasesPinAtOnce is the caller's promise that it releases the put's pin
// as soon as the put returns, neither keeping nor cloning it, and relies
// on its link (WithLink) alone to keep the blob. A small put whose link
// runs in its own transaction may then write no pin row where the link
// protects the blob in every process (gc.Collector.BeginPublish, linked: SQLite), so
// the pin it returns protects the blob in this process only. Without this
// option a put always writes its row, so that a pin it hands on (an HTTP
// pin token) keeps the blob from every process's sweeps even once no
// namespace links it.
func ReleasesPinAtOnce() PutOption { return func(o *putOptions) { o.releasesPin = true } }

// copyBufSize is the unit of streaming I/O: large enough to amortize
// syscalls and hashing setup, small enough not to matter per goroutine.
const copyBufSize = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// Put stores the content of r and returns its digest and a pin on it. size
// is the content length, or -1 if unknown. With a known size, r must yield
// exactly size bytes. The caller releases the pin.
func (s *Store) Put(ctx context.Context, r io.Reader, size int64, opts ...PutOption) (Digest, *Pin, error) {
	return s.put(ctx, r, size, nil, opts)
}

// PutVerified is Put for content claimed to hash to want: on mismatch it
// stores nothing and returns ErrVerification.
func (s *Store) PutVerified(ctx context.Context, want Digest, r io.Reader, size int64, opts ...PutOption) (*Pin, error) {
	_, pin, err := s.put(ctx, r, size, &want, opts)
	return pin, err
}

// PutBytes stores b (a convenience over Put).
func (s *Store) PutBytes(ctx context.Context, b []byte, opts ...PutOption) (Digest, *Pin, error) {
	if s.kv != nil && int64(len(b)) <= s.threshold {
		return s.putSmall(ctx, b, nil, applyOpts(opts))
	}
	return s.put(ctx, bytesReader(b), int64(len(b)), nil, opts)
}

func applyOpts(opts []PutOption) putOptions {
	var o putOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

func (s *Store) put(ctx context.Context, r io.Reader, size int64, want *Digest, opts []PutOption) (Digest, *Pin, error) {
	if s.closed.Load() {
		return Digest{}, nil, ErrClosed
	}
	if err := s.writable("put"); err != nil {
		return Digest{}, nil, err
	}
	if size < -1 {
		return Digest{}, nil, fmt.Errorf("put: invalid size %d", size)
	}
	o := applyOpts(opts)
	switch {
	case size >= 0 && size <= s.threshold && s.kv != nil:
		buf := make([]byte, size)
		if _, err := io.ReadFull(r, buf); err != nil {
			return Digest{}, nil, readErr(err, size)
		}
		if err := expectEOF(r, size); err != nil {
			return Digest{}, nil, err
		}
		return s.putSmall(ctx, buf, want, o)
	case size > s.threshold && s.large == nil:
		return Digest{}, nil, fmt.Errorf("put: %d bytes over the %s limit of %d bytes: %w", size, s.mode, s.threshold, ErrTooLarge)
	case size >= 0 || s.kv == nil:
		return s.putLarge(ctx, nil, r, size, want, o)
	}
	// Unknown length: buffer up to the threshold; spill into a stage only
	// if the content turns out larger, handing it what was buffered. The
	// buffer grows with what arrives: a 2 GiB threshold must not cost 2 GiB
	// for a 10-byte put.
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, s.threshold+1))
	switch {
	case err != nil:
		return Digest{}, nil, fmt.Errorf("put: read: %w", err)
	case n <= s.threshold:
		return s.putSmall(ctx, buf.Bytes(), want, o)
	case s.large == nil:
		return Digest{}, nil, fmt.Errorf("put: content over the %s limit of %d bytes: %w", s.mode, s.threshold, ErrTooLarge)
	}
	return s.putLarge(ctx, buf.Bytes(), r, -1, want, o)
}

func readErr(err error, size int64) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("put: content shorter than the declared %d bytes", size)
	}
	return fmt.Errorf("put: read: %w", err)
}

// expectEOF fails a known-size put whose reader has more to give: the
// declared size and the content disagree, so neither can be trusted.
func expectEOF(r io.Reader, size int64) error {
	var one [1]byte
	n, err := io.ReadFull(r, one[:])
	if n > 0 {
		return fmt.Errorf("put: content longer than the declared %d bytes", size)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("put: read: %w", err)
	}
	return nil
}

func (s *Store) putSmall(ctx context.Context, b []byte, want *Digest, o putOptions) (Digest, *Pin, error) {
	d := blob.Sum(b)
	if want != nil && d != *want {
		return Digest{}, nil, blob.Wrap("put", s.kv.Name(), *want, fmt.Errorf("%w: content hashes to %s", ErrVerification, d))
	}
	var pin *Pin
	var inserted bool
	var err error
	if p, joint := s.kv.(meta.Putter); joint && (o.linker != nil || s.gc.Shared()) {
		pin, inserted, err = s.putRows(ctx, p, d, b, o)
	} else {
		pin, inserted, err = s.putThenLink(ctx, d, b, o)
	}
	if err != nil {
		return Digest{}, nil, putErr(s.kv.Name(), d, err)
	}
	if !inserted {
		// A dedup: unless the stored copy is known corrupt, in which case
		// this content replaces it (the pin protects it meanwhile).
		mark, err := s.repairing(ctx, s.kv, d)
		if err == nil && mark != nil {
			inserted, err = s.kv.Put(ctx, d, b)
			s.repaired(ctx, d, mark)
		}
		if err != nil {
			pin.Release()
			return Digest{}, nil, putErr(s.kv.Name(), d, err)
		}
	}
	s.count(inserted, int64(len(b)))
	return d, pin, nil
}

// putRows is a small put whose entry commits with its rows (the joint
// put): what commits is one value, built here — the pin row from gc, the
// namespace part from the caller — which the kv engine writes in the
// entry's transaction, in its own order (meta.Putter: SQLite writes the
// pin row first, PostgreSQL's transaction the namespace part first). A
// link or intent in that transaction keeps d live by itself where the
// host serializes arbitrations with transactions: when the caller drops
// the pin at once (ReleasesPinAtOnce), gc hands out no pin row there
// (Collector.BeginPublish).
func (s *Store) putRows(ctx context.Context, p meta.Putter, d Digest, b []byte, o putOptions) (*Pin, bool, error) {
	pub, pinRow, err := s.gc.BeginPublish(ctx, d, o.linker != nil && o.releasesPin)
	if err != nil {
		return nil, false, err
	}
	rows := meta.Rows{
		Pin: pinRow,                     // owner and TTL, or none
		NS:  o.ns.For(d, int64(len(b))), // the link, intent or settle, or none
	}
	// Done runs on every path, a panic's included: meta.Batcher raises
	// a job's panic again in its caller and net/http recovers a handler's,
	// so a put that skipped Done would leave the collector's row lock
	// read-held and d's row claim open, and the next renewal, pin of d or
	// Close would wait for it forever. The panic itself goes on untouched.
	done := false
	defer func() {
		if !done {
			pub.Done(errPutRowsPanicked)
		}
	}()
	inserted, err := p.PutRows(ctx, d, b, rows)
	done = true
	pin, err := pub.Done(err)
	return pin, inserted, err
}

// errPutRowsPanicked is the outcome putRows gives its publish when the
// kv engine's PutRows panicked: the row may not have committed.
var errPutRowsPanicked = errors.New("the kv engine's put panicked")

// putThenLink is a small put on a kv engine that cannot commit rows with
// its entry (mem): pin first (its row, where the store keeps them, in a
// transaction of its own), publish, then the namespace part through the
// caller's Linker, as a link of a stored blob is made.
func (s *Store) putThenLink(ctx context.Context, d Digest, b []byte, o putOptions) (*Pin, bool, error) {
	pin, err := s.gc.Pin(ctx, d)
	if err != nil {
		return nil, false, err
	}
	inserted, err := s.kv.Put(ctx, d, b)
	if err == nil && o.linker != nil {
		err = o.linker.CommitRows(ctx, o.ns.For(d, int64(len(b))))
	}
	if err != nil {
		pin.Release()
		return nil, false, err
	}
	return pin, inserted, nil
}

// repairing prepares a put of d, whose content the caller has hashed, to
// repair a copy known corrupt: if the ledger marks d, the stored copy in e
// is deleted, so that the put stores the new content instead of keeping
// the bad bytes as a dedup would. The caller holds a pin on d, so no sweep
// takes it meanwhile; a reader that opens d in between finds it missing
// for that moment, which beats being refused. It returns the mark, for
// repaired; nil when d is not marked.
func (s *Store) repairing(ctx context.Context, e engines.Engine, d Digest) (*meta.Mark, error) {
	m, ok, err := s.ledger.get(ctx, d)
	if err != nil {
		return nil, blob.Wrap("put", e.Name(), d, fmt.Errorf("read the corrupt ledger: %w", err))
	}
	if !ok {
		return nil, nil
	}
	if err := e.Delete(ctx, d); err != nil && !errors.Is(err, ErrMissing) {
		return nil, blob.Wrap("repair", e.Name(), d, err)
	}
	return &m, nil
}

// repaired ends the corrupt record of d once the put that repairs it has
// published.
func (s *Store) repaired(ctx context.Context, d Digest, m *meta.Mark) {
	if m == nil {
		return
	}
	s.verdicts.forget(d)
	if err := s.ledger.clear(ctx, d, m.File); err != nil {
		s.log.Warn("blob put again over a corrupt copy, but its corrupt record stays", "digest", d.String(), "err", err)
		return
	}
	s.log.Info("blob known corrupt repaired: its content was put again", "digest", d.String())
}

func (s *Store) count(inserted bool, n int64) {
	s.stats.puts.Add(1)
	if inserted {
		s.stats.bytesIn.Add(n)
	} else {
		s.stats.dedups.Add(1)
	}
}

// putLarge streams prefix then r into a stage, hashing once as it goes.
// size -1 means unknown. Every exit before Commit discards the stage.
func (s *Store) putLarge(ctx context.Context, prefix []byte, r io.Reader, size int64, want *Digest, o putOptions) (Digest, *Pin, error) {
	st, err := s.large.Stage(ctx)
	if err != nil {
		return Digest{}, nil, blob.Wrap("stage", s.large.Name(), Digest{}, err)
	}
	defer st.Discard()
	h := newContentHash()
	pipe := newHashPipe(shaOnly{h})
	err = s.copyInto(ctx, st, pipe, h, prefix, r, size)
	pipe.wait()
	if err != nil {
		return Digest{}, nil, err
	}
	return s.commitLarge(ctx, st, h, want, o)
}

// commitLarge publishes a fully written stage whose content h has hashed.
func (s *Store) commitLarge(ctx context.Context, st engines.Stage, h *contentHash, want *Digest, o putOptions) (Digest, *Pin, error) {
	d := h.digest()
	if want != nil && d != *want {
		return Digest{}, nil, blob.Wrap("put", s.large.Name(), *want, fmt.Errorf("%w: content hashes to %s", ErrVerification, d))
	}
	if sc, ok := st.(engines.SidecarStage); ok {
		sc.SetSidecar(h.sidecar())
	}
	// Design point (large put ordering): pin first, publish second — the
	// pin row commits before the commit-rename (or the large object's
	// commit) makes the entry visible, so no arbitration can see it
	// visible and unpinned; a crash in between leaves only an orphan row,
	// which expires and is reaped. Never the reverse.
	pin, err := s.gc.Pin(ctx, d)
	if err != nil {
		return Digest{}, nil, err
	}
	mark, err := s.repairing(ctx, s.large, d)
	if err != nil {
		pin.Release()
		return Digest{}, nil, err
	}
	if err := st.Commit(ctx, d); err != nil {
		pin.Release()
		return Digest{}, nil, blob.Wrap("commit", s.large.Name(), d, err)
	}
	s.repaired(ctx, d, mark)
	if o.linker != nil {
		if err := o.linker.CommitRows(ctx, o.ns.For(d, h.n)); err != nil {
			pin.Release()
			return Digest{}, nil, blob.Wrap("link", s.large.Name(), d, err)
		}
	}
	if o.local != nil {
		s.writeThrough(ctx, d, o.local, h.n, h.sidecar())
	}
	s.count(true, h.n)
	return d, pin, nil
}

// copyInto writes prefix and then r into st, hashing with pipe (the
// sha256) and h (the chunk checksums, as it writes), and enforces a known
// size exactly. It reads on the caller's goroutine into
// buffers that the stage writer and the hash pipe then take on theirs,
// without a copy (stagewriter.go): a large put costs about the slowest of
// reading, writing and hashing instead of their sum.
func (s *Store) copyInto(ctx context.Context, st io.Writer, pipe *hashPipe, h *contentHash, prefix []byte, r io.Reader, size int64) error {
	w := newStageWriter(appender{st}, h)
	err := feed(ctx, w, pipe, prefix, r, size)
	if werr := w.stop(); werr != nil {
		return blob.Wrap("stage", s.large.Name(), Digest{}, werr)
	}
	return err
}

// feed queues prefix and then what r yields into w and pipe, until r ends
// or fails, or a write of w fails (which w reports).
func feed(ctx context.Context, w *stageWriter, pipe *hashPipe, prefix []byte, r io.Reader, size int64) error {
	w.append(prefix, 0, pipe)
	n := int64(len(prefix))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if w.failed() != nil {
			return nil
		}
		want := int64(copyBufSize)
		if size >= 0 && size-n < want {
			want = size - n
			if want == 0 {
				return expectEOF(r, size)
			}
		}
		bp := copyBufs.Get().(*[]byte)
		k, err := fill(r, (*bp)[:want])
		if k > 0 {
			w.give(bp, k, n, pipe)
			n += int64(k)
		} else {
			copyBufs.Put(bp)
		}
		if errors.Is(err, io.EOF) {
			if size >= 0 && n != size {
				return fmt.Errorf("put: content shorter than the declared %d bytes (got %d)", size, n)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("put: read: %w", err)
		}
	}
}

// fill reads from r into p until p is full or r returns an error (io.EOF
// at its end): a body that arrives in small reads (HTTP) is still written
// and hashed in buffers of copyBufSize.
func fill(r io.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := r.Read(p[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// putErr is err as the put of d on engine, wrapped once: an engine that
// already named the put (sqlite's "put sqlite:… DIGEST: …") is not named
// again.
func putErr(engine string, d Digest, err error) error {
	if be, ok := errors.AsType[*blob.Error](err); ok && be.Op == "put" && be.Engine == engine && be.Digest == d {
		return err
	}
	return blob.Wrap("put", engine, d, err)
}
