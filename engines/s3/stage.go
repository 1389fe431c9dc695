package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

var _ engines.SidecarStage = (*stage)(nil)

const (
	// maxParts is S3's limit on the parts of one multipart upload.
	maxParts = 10000
	// maxInflight is how many parts of a stage upload at once while the
	// next fills: a stage holds at most maxInflight+1 part buffers.
	maxInflight = 2
)

// copyPartSize is the part size of the server-side copy of a staged blob
// larger than it (UploadPartCopy); smaller ones are one CopyObject. A
// variable so that tests can reach the multipart copy with small blobs.
var copyPartSize int64 = maxCopyPart

// Stage implements engines.Large. Bytes gather in a part buffer; the first
// full part starts a multipart upload to a staging key, PREFIX/stage/ID,
// and parts upload in the background, maxInflight at a time, while the
// next fills (so a stage holds at most maxInflight+1 part buffers). A blob
// that never fills a part is one PUT at Commit, straight to its key.
//
// ctx bounds the stage's uploads (io.Writer has no context of its own);
// Commit takes its own.
func (e *Engine) Stage(ctx context.Context) (engines.Stage, error) {
	if err := ctx.Err(); err != nil {
		return nil, e.wrap("stage", blob.Digest{}, err)
	}
	var id [12]byte
	rand.Read(id[:])
	s := &stage{
		e:   e,
		ctx: ctx,
		// The time in the key is for people reading a listing; Open judges
		// staleness by the server's LastModified.
		key: e.staging + strconv.FormatInt(time.Now().Unix(), 10) + "-" + hex.EncodeToString(id[:]),
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, e.wrap("stage", blob.Digest{}, blob.ErrClosed)
	}
	e.stages[s] = struct{}{}
	return s, nil
}

var partBufs = sync.Pool{New: func() any { return new([]byte) }}

func getBuf(size int) *[]byte {
	b := partBufs.Get().(*[]byte)
	if cap(*b) < size {
		*b = make([]byte, 0, size)
	}
	*b = (*b)[:0]
	return b
}

// partResult is what a part upload reports.
type partResult struct {
	part minio.CompletePart
	err  error
}

// stage is a put in progress. One goroutine at a time writes a stage; the
// lock makes Discard from another goroutine (Engine.Close) safe.
type stage struct {
	e   *Engine
	ctx context.Context
	key string // the staging key; immutable

	mu       sync.Mutex
	ended    bool
	err      error   // sticky: a failed write fails the stage
	buf      *[]byte // the part filling; nil when empty
	n        int64   // bytes written
	uploadID string  // the multipart upload, once the first part is full
	parts    []minio.CompletePart
	inflight []chan partResult // the parts uploading, oldest first
	staged   bool              // the upload completed: the staging object exists
	sidecar  []byte

	// final is the blob's key while Commit publishes it (guarded by e.mu):
	// an upload there (the copy of a blob over 5 GiB) is this stage's.
	final string
}

// keys lists the server-side keys the stage owns; e.mu is held.
func (s *stage) keys() []string {
	if s.final != "" {
		return []string{s.key, s.final}
	}
	return []string{s.key}
}

// partSize is the size of part n (from 1): the configured size for the
// first 1000 parts, then one more multiple of it per 1000, so that 10000
// parts hold 55000 base parts (430 GiB at 8 MiB) while a stage's memory
// stays at most maxInflight+1 parts.
func (s *stage) partSize(n int) int {
	return s.e.cfg.PartSize * (1 + (n-1)/1000)
}

func (s *stage) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return 0, s.e.wrap("stage write", blob.Digest{}, fs.ErrClosed)
	}
	if s.err != nil {
		return 0, s.err
	}
	n := 0
	for n < len(p) {
		size := s.partSize(len(s.parts) + 1 + s.pending())
		if s.buf == nil {
			s.buf = getBuf(size)
		}
		k := min(len(p)-n, size-len(*s.buf))
		*s.buf = append(*s.buf, p[n:n+k]...)
		n += k
		s.n += int64(k)
		if len(*s.buf) == size {
			if err := s.flush(); err != nil {
				return n, s.fail(err)
			}
		}
	}
	return n, nil
}

// pending counts the parts uploading (not in s.parts yet).
func (s *stage) pending() int { return len(s.inflight) }

// flush starts uploading the full part buffer, after the previous part's
// upload ended, starting the multipart upload at the first part.
func (s *stage) flush() error {
	for len(s.inflight) >= maxInflight {
		if err := s.waitOne(); err != nil {
			return err
		}
	}
	if len(s.parts)+len(s.inflight) >= maxParts {
		return fmt.Errorf("blob over %d bytes: more than S3's %d parts", s.n-int64(len(*s.buf)), maxParts)
	}
	if s.uploadID == "" {
		ctx, cancel := context.WithTimeout(s.ctx, metaTimeout)
		id, err := s.e.core.NewMultipartUpload(ctx, s.e.cfg.Bucket, s.key, minio.PutObjectOptions{})
		cancel()
		if err != nil {
			return s.e.reqErr("CREATE upload", s.key, err)
		}
		s.uploadID = id
	}
	buf, id, n := s.buf, s.uploadID, len(s.parts)+len(s.inflight)+1
	s.buf = nil
	ch := make(chan partResult, 1)
	s.inflight = append(s.inflight, ch)
	go func() {
		defer partBufs.Put(buf)
		ctx, cancel := context.WithTimeout(s.ctx, dataTimeout)
		defer cancel()
		ch <- s.e.putPart(ctx, s.key, id, n, *buf)
	}()
	return nil
}

// putPart uploads one part of a multipart upload.
func (e *Engine) putPart(ctx context.Context, key, id string, n int, b []byte) partResult {
	p, err := e.core.PutObjectPart(ctx, e.cfg.Bucket, key, id, n, bytes.NewReader(b), int64(len(b)),
		minio.PutObjectPartOptions{DisableContentSha256: true})
	if err != nil {
		return partResult{err: e.reqErr("PUT part "+strconv.Itoa(n)+" of", key, err)}
	}
	return partResult{part: minio.CompletePart{PartNumber: n, ETag: p.ETag}}
}

// wait waits for every part uploading and records them; the first error
// is returned.
func (s *stage) wait() error {
	var first error
	for len(s.inflight) > 0 {
		if err := s.waitOne(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitOne waits for the oldest part uploading and records it: parts end
// in s.parts in ascending order, as CompleteMultipartUpload wants them.
func (s *stage) waitOne() error {
	r := <-s.inflight[0]
	s.inflight = s.inflight[1:]
	if r.err != nil {
		return r.err
	}
	s.parts = append(s.parts, r.part)
	return nil
}

// fail makes err the stage's sticky error and aborts at once, so a failed
// stage holds nothing on the server while its caller gets round to
// Discard.
func (s *stage) fail(err error) error {
	s.err = s.e.wrap("stage write", blob.Digest{}, err)
	s.abort()
	return s.err
}

func (s *stage) release() {
	if s.buf != nil {
		partBufs.Put(s.buf)
		s.buf = nil
	}
}

// abort drops pending bytes and removes what the stage has on the server:
// its multipart upload, or the staging object it completed. A failure
// (the server is down) is logged; Open removes what is left once stale.
// It uses its own context: the stage's or Commit's may be what ended.
func (s *stage) abort() {
	s.release()
	s.wait() // its error is moot
	ctx, cancel := context.WithTimeout(context.Background(), metaTimeout)
	defer cancel()
	if s.uploadID != "" {
		if err := s.e.abortUpload(ctx, s.key, s.uploadID); err != nil {
			s.e.log.Warn("could not abort an S3 multipart upload; it will be removed once stale", "key", s.key, "err", err)
		}
		s.uploadID = ""
	}
	if s.staged {
		if err := s.e.remove(ctx, s.key); err != nil {
			s.e.log.Warn("could not remove an S3 staging object; it will be removed once stale", "key", s.key, "err", err)
		}
		s.staged = false
	}
	s.parts = nil
}

// end marks the stage over and forgets it in the engine.
func (s *stage) end() {
	s.ended = true
	s.e.mu.Lock()
	delete(s.e.stages, s)
	s.final = ""
	s.e.mu.Unlock()
}

// Commit implements engines.Stage. The stage ends here whatever happens;
// on failure nothing of it is left on the server (or, if the server
// cannot be reached to remove it, only under the staging prefix).
func (s *stage) Commit(ctx context.Context, d blob.Digest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return s.e.wrap("commit", d, fs.ErrClosed)
	}
	defer s.end()
	if s.err != nil {
		s.abort()
		return s.e.wrap("commit", d, s.err)
	}
	if err := s.commit(ctx, d); err != nil {
		s.abort()
		return s.e.wrap("commit", d, err)
	}
	s.abort() // the staging object, after a dedup or a copy
	return nil
}

func (s *stage) commit(ctx context.Context, d blob.Digest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e := s.e
	final := e.Key(d)
	e.mu.Lock()
	s.final = final
	e.mu.Unlock()
	// Dedup: what is there stays (a reader may have it open).
	if ok, err := e.present(ctx, final); err != nil || ok {
		return err
	}
	if s.uploadID == "" {
		// Under one part: one PUT, straight to the key.
		var b []byte
		if s.buf != nil {
			b = *s.buf
		}
		return s.publish(ctx, d, func() error { return e.putSmall(ctx, final, b) })
	}
	if s.buf != nil && len(*s.buf) > 0 {
		if err := s.flush(); err != nil {
			return err
		}
	}
	if err := s.wait(); err != nil {
		return err
	}
	t0 := time.Now()
	cctx, cancel := context.WithTimeout(ctx, dataTimeout)
	_, err := e.core.CompleteMultipartUpload(cctx, e.cfg.Bucket, s.key, s.uploadID, s.parts, minio.PutObjectOptions{})
	cancel()
	if err != nil {
		return e.reqErr("COMPLETE upload", s.key, err)
	}
	s.uploadID = ""
	s.staged = true
	t1 := time.Now()
	err = s.publish(ctx, d, func() error { return e.copy(ctx, s.key, final, s.n) })
	e.log.Debug("S3 commit of a staged upload", "key", final, "bytes", s.n, "parts", len(s.parts),
		"complete", t1.Sub(t0), "copy", time.Since(t1), "err", err)
	return err
}

// publish writes the sidecar, if any, then runs put, which makes the blob
// visible. The sidecar goes first so that a visible blob has it; if put
// fails, the sidecar is removed again.
func (s *stage) publish(ctx context.Context, d blob.Digest, put func() error) error {
	e := s.e
	if s.sidecar != nil {
		if err := e.putSmall(ctx, e.sumsKey(d), s.sidecar); err != nil && !errors.Is(err, errPresent) {
			return err
		}
	}
	err := put()
	if errors.Is(err, errPresent) {
		return nil // another put of d won the race: dedup
	}
	if err != nil && s.sidecar != nil {
		rctx, cancel := context.WithTimeout(context.Background(), metaTimeout)
		if rerr := e.remove(rctx, e.sumsKey(d)); rerr != nil {
			e.log.Warn("could not remove an S3 sidecar after a failed commit", "key", e.sumsKey(d), "err", rerr)
		}
		cancel()
	}
	return err
}

// errPresent: a conditional put found its key present.
var errPresent = errors.New("present already")

// putSmall PUTs b under key with If-None-Match: *, so that a racing put of
// the same key does not replace it (errPresent), on servers that support
// it; the HEAD before it covers the others.
func (e *Engine) putSmall(ctx context.Context, key string, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, dataTimeout)
	defer cancel()
	for {
		opts := minio.PutObjectOptions{DisableContentSha256: true}
		cond := !e.noCond.Load()
		if cond {
			opts.SetMatchETagExcept("*")
		}
		_, err := e.core.PutObject(ctx, e.cfg.Bucket, key, bytes.NewReader(b), int64(len(b)), "", "", opts)
		if err == nil {
			return nil
		}
		r := minio.ToErrorResponse(err)
		switch {
		case r.StatusCode == http.StatusPreconditionFailed || r.Code == "PreconditionFailed":
			return errPresent
		case r.StatusCode == http.StatusConflict && r.Code == "ConditionalRequestConflict":
			// Another conditional put is under way: whether it wins or
			// not, try again once it is decided.
			time.Sleep(100 * time.Millisecond)
			continue
		case cond && (r.StatusCode == http.StatusNotImplemented || r.Code == "NotImplemented"):
			e.log.Info("the S3 server does not support conditional puts (If-None-Match); relying on HEAD before each put", "engine", e.name)
			e.noCond.Store(true)
			continue
		}
		// A server may refuse a conditional put before it reads the body
		// (versitygw answers 412 at once and closes the connection), so a
		// client still writing the body sees a reset instead of the 412,
		// at every retry. A PUT is atomic: if the key is there now, another
		// put of the same content won, and this one has nothing to do.
		if ok, herr := e.present(ctx, key); herr == nil && ok {
			e.log.Debug("S3 put failed and the key is present: another put of the same content won", "key", key, "err", err)
			return errPresent
		}
		return e.reqErr("PUT", key, err)
	}
}

// copy makes the staged object src visible under dst by server-side copy:
// one CopyObject up to copyPartSize, else a multipart copy
// (UploadPartCopy), which ComposeObject aborts if it fails.
func (e *Engine) copy(ctx context.Context, src, dst string, size int64) error {
	ctx, cancel := context.WithTimeout(ctx, copyTimeout)
	defer cancel()
	srcOpts := minio.CopySrcOptions{Bucket: e.cfg.Bucket, Object: src}
	dstOpts := minio.CopyDestOptions{Bucket: e.cfg.Bucket, Object: dst}
	var err error
	if size <= copyPartSize {
		_, err = e.client.CopyObject(ctx, dstOpts, srcOpts)
	} else {
		dstOpts.PartSize = uint64(copyPartSize)
		_, err = e.client.ComposeObject(ctx, dstOpts, srcOpts)
	}
	return e.reqErr("COPY "+src+" to", dst, err)
}

// Discard implements engines.Stage; after the stage ended it is a no-op.
func (s *stage) Discard() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil
	}
	s.abort()
	s.end()
	return nil
}

// SetSidecar implements engines.SidecarStage: Commit stores it as the
// object PREFIX/sums/ab/…, before the blob. A dedup Commit keeps the
// present blob's.
func (s *stage) SetSidecar(b []byte) {
	s.mu.Lock()
	s.sidecar = append([]byte{}, b...)
	s.mu.Unlock()
}
