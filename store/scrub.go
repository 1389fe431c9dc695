package store

import (
	"context"
	"errors"
	"io"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// ScrubStatus is a scrub's verdict on one blob.
type ScrubStatus string

const (
	ScrubOK ScrubStatus = "ok"
	// ScrubCorrupt: the content does not hash to its digest, fails a
	// chunk checksum, or ends early.
	ScrubCorrupt ScrubStatus = "corrupt"
	// ScrubUnreadable: the engine failed to deliver the bytes (they may
	// be fine).
	ScrubUnreadable ScrubStatus = "unreadable"
	// ScrubMissing: a digest named explicitly is not in the store, or
	// one a namespace links is not (Lost).
	ScrubMissing ScrubStatus = "missing"
)

// ScrubResult is the verdict on one blob.
type ScrubResult struct {
	Digest Digest      `json:"digest"`
	Tier   Tier        `json:"tier,omitempty"`
	Status ScrubStatus `json:"status"`
	Error  string      `json:"error,omitempty"`
	// Lost: missing, and a namespace links it (lost.go); a whole scrub
	// counts it missing.
	Lost bool  `json:"lost,omitempty"`
	Size int64 `json:"-"`
	// File is the identity of a local blob's backing file, when it was
	// the same before and after the read: the verdict is about that
	// version of the file. Nil for other blobs.
	File *engines.FileID `json:"-"`
}

// ScrubSummary counts a scrub.
type ScrubSummary struct {
	Checked    int64         `json:"checked"` // blobs read (intact or not)
	Bytes      int64         `json:"bytes"`   // bytes of the intact ones
	Corrupt    int64         `json:"corrupt"`
	Unreadable int64         `json:"unreadable"`
	Missing    int64         `json:"missing"`
	Duration   time.Duration `json:"duration_ns"`
	Error      string        `json:"error,omitempty"` // why the scrub stopped early
}

// Bad is the number of blobs found corrupt, unreadable or missing.
func (s ScrubSummary) Bad() int64 { return s.Corrupt + s.Unreadable + s.Missing }

// ScrubOptions configures a Scrub.
type ScrubOptions struct {
	// Jobs is the number of blobs read in parallel (at least 1).
	Jobs int
	// Rate bounds the bytes read per second, all jobs together; 0 is
	// unlimited.
	Rate int64
	// Explicit says the digests were named by a user: one the store
	// lacks is then reported ScrubMissing, whereas a listed blob that
	// vanished before it was read (a concurrent sweep) is skipped.
	Explicit bool
	// Result, if set, receives every verdict (intact ones too), from one
	// goroutine, as they come. An error from it stops the scrub.
	Result func(ScrubResult) error
}

// Digests is what a scrub of the whole store reads: every digest in the
// store, in List order, then every lost one (a namespace links it, no
// tier holds it), which the scrub reports missing.
func (s *Store) Digests(ctx context.Context) iter.Seq2[Digest, error] {
	return func(yield func(Digest, error) bool) {
		for e, err := range s.List(ctx) {
			if !yield(e.Digest, err) || err != nil {
				return
			}
		}
		for d, err := range s.gc.Lost(ctx) {
			if !yield(d, err) || err != nil {
				return
			}
		}
	}
}

// Digests is ds as a scrub's sequence.
func Digests(ds ...Digest) iter.Seq2[Digest, error] {
	return func(yield func(Digest, error) bool) {
		for _, d := range ds {
			if !yield(d, nil) {
				return
			}
		}
	}
}

// Scrub reads the blobs of seq (Pool for the whole store) through the
// verifying reader, to EOF, and checks that each still hashes to its
// digest. It reads the medium, not the page cache: a local blob's cached
// pages are dropped before it is read (and after, so that a scrub does not
// flush the cache of everything else). Memory stays bounded: Jobs readers
// of one buffer each. The error is for failures of the scrub itself
// (listing, cancellation, Result), not for bad blobs; the summary counts
// what was done until then.
func (s *Store) Scrub(ctx context.Context, seq iter.Seq2[Digest, error], o ScrubOptions) (ScrubSummary, error) {
	start := time.Now()
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := max(1, o.Jobs)
	p := newPacer(o.Rate)
	work := make(chan Digest, jobs)
	results := make(chan ScrubResult, jobs)
	var listErr error
	go func() {
		defer close(work)
		for d, err := range seq {
			if err != nil {
				listErr = err
				return
			}
			select {
			case work <- d:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range jobs {
		wg.Go(func() {
			for d := range work {
				if r, ok := s.scrubOne(ctx, d, p); ok {
					results <- r
				}
			}
		})
	}
	go func() { wg.Wait(); close(results) }()

	var sum ScrubSummary
	var resErr error
	for r := range results {
		switch r.Status {
		case ScrubOK:
			sum.Checked++
			sum.Bytes += r.Size
		case ScrubCorrupt:
			sum.Checked++
			sum.Corrupt++
		case ScrubUnreadable:
			sum.Checked++
			sum.Unreadable++
		case ScrubMissing:
			if !o.Explicit && !r.Lost {
				continue
			}
			sum.Missing++
		}
		if o.Result != nil && resErr == nil {
			if resErr = o.Result(r); resErr != nil {
				cancel()
			}
		}
	}
	sum.Duration = time.Since(start)
	// results is closed, so the lister has returned: listErr is settled.
	if err := errors.Join(listErr, resErr); err != nil {
		return sum, err
	}
	return sum, parent.Err() // interrupted: the counts are partial
}

// scrubOne reads d to EOF through the verifying reader, bypassing the
// verdicts (a scrub is what judges), and records its verdict
// (recordScrub); ok is false when the scrub is stopping and d was not
// read.
func (s *Store) scrubOne(ctx context.Context, d Digest, p *pacer) (ScrubResult, bool) {
	res := ScrubResult{Digest: d}
	if ctx.Err() != nil {
		return res, false
	}
	var mark *meta.Mark
	if m, ok, err := s.ledger.get(ctx, d); err != nil {
		s.log.Warn("scrub: reading the corrupt ledger", "digest", d.String(), "err", err)
	} else if ok {
		mark = &m
	}
	r, ok, err := s.open(ctx, d, false)
	switch {
	case err != nil:
		// Get verifies kv blobs as it opens them, so a corrupt kv blob
		// fails here; find its tier from metadata.
		if info, ok, serr := s.Stat(ctx, d); serr == nil && ok {
			res.Tier = info.Tier
		}
		res, ok := classify(res, err)
		if ok {
			s.recordScrub(ctx, res, engines.FileID{}, false, false, mark)
		}
		return res, ok
	case !ok:
		res.Status = ScrubMissing
		if _, lerr := s.lostErr(ctx, "scrub", d); errors.Is(lerr, ErrLost) {
			res.Lost, res.Error = true, lerr.Error()
		}
		return res, true
	}
	defer r.Close()
	// A scrub's verdict is the whole blob's hash at EOF, and its bytes go
	// nowhere: no chunk checks, which would call a blob whose checksums
	// alone are damaged corrupt.
	r.v = nil
	res.Tier, res.Size = r.Tier(), r.Len()
	before, isFile := cursorFile(r.cur)
	if isFile {
		dropCached(r.cur)
		defer dropCached(r.cur)
	}
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	var rerr error
	for {
		n, err := r.Read(*bp)
		if werr := p.wait(ctx, n); werr != nil {
			return res, false
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			rerr = err
			break
		}
	}
	after, ok := cursorFile(r.cur)
	stable := isFile && ok && after == before
	if stable {
		res.File = &after
	}
	if rerr != nil {
		if ok, herr := s.Has(ctx, d); herr == nil && !ok {
			// Swept while it was read (an engine that cannot read a
			// deleted blob through an open cursor, pglo): not a fault.
			res.Status = ScrubMissing
			return res, true
		}
		res, ok := classify(res, rerr)
		if ok {
			s.recordScrub(ctx, res, after, stable, isFile, mark)
		}
		return res, ok
	}
	res.Status = ScrubOK
	s.recordScrub(ctx, res, after, stable, isFile, mark)
	return res, true
}

// classify turns a read error into a verdict: content that does not hash
// to its digest, or that ends early, is corrupt; any other failure is
// unreadable (the medium failed to deliver the bytes).
func classify(res ScrubResult, err error) (ScrubResult, bool) {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return res, false
	case errors.Is(err, ErrMissing):
		res.Status = ScrubMissing // deleted since it was listed
	case errors.Is(err, ErrVerification), errors.Is(err, io.ErrUnexpectedEOF):
		res.Status, res.Error = ScrubCorrupt, err.Error()
	default:
		res.Status, res.Error = ScrubUnreadable, err.Error()
	}
	return res, true
}

// dropCached asks the kernel to drop a local blob's clean cached pages, so
// that the next read comes from the medium. Advisory: errors are ignored.
func dropCached(c engines.Cursor) {
	if fc, ok := c.(engines.FileCursor); ok {
		_ = unix.Fadvise(int(fc.File().Fd()), 0, 0, unix.FADV_DONTNEED)
	}
}

// pacer holds a scrub to a byte rate: the n-th byte is read no earlier
// than n/rate seconds after the start.
type pacer struct {
	rate  int64 // bytes per second; 0: unlimited
	start time.Time
	n     atomic.Int64
}

func newPacer(rate int64) *pacer { return &pacer{rate: rate, start: time.Now()} }

// wait accounts for k bytes read and sleeps until the rate allows them;
// it returns ctx's error if ctx ends first (or had ended).
func (p *pacer) wait(ctx context.Context, k int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.rate <= 0 || k <= 0 {
		return nil
	}
	total := p.n.Add(int64(k))
	due := p.start.Add(time.Duration(float64(total) / float64(p.rate) * float64(time.Second)))
	d := time.Until(due)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
