package pglo

import (
	"context"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

var _ engines.SidecarStage = (*stage)(nil)

// Stage implements engines.Large. The stage's transaction begins with its
// first chunk (a stage that never fills one costs nothing until Commit):
// lo_from_bytea creates the object with the first 512 KiB, lo_put appends
// the rest, and Commit inserts the companion row in the same transaction.
// Every other ending rolls it back, and the object never existed.
//
// ctx bounds the stage's writes (io.Writer has no context of its own);
// Commit takes its own.
func (e *Engine) Stage(ctx context.Context) (engines.Stage, error) {
	if err := ctx.Err(); err != nil {
		return nil, e.wrap("stage", blob.Digest{}, err)
	}
	s := &stage{e: e, ctx: ctx}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, e.wrap("stage", blob.Digest{}, blob.ErrClosed)
	}
	e.stages[s] = struct{}{}
	return s, nil
}

var chunkBufs = sync.Pool{New: func() any { b := make([]byte, 0, chunkSize); return &b }}

// stage is a put in progress. One goroutine at a time writes a stage; the
// lock makes Discard from another goroutine (Engine.Close) safe.
type stage struct {
	e   *Engine
	ctx context.Context

	mu      sync.Mutex
	ended   bool
	err     error   // sticky: a failed write fails the stage
	tx      pgx.Tx  // nil until the first chunk
	oid     uint32  // the object, once tx is open
	off     int64   // bytes flushed into the object
	buf     *[]byte // pending bytes, < chunkSize; nil when empty
	sidecar []byte
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
		if s.buf == nil && len(p)-n >= chunkSize {
			// A whole chunk in the caller's buffer: no copy.
			if err := s.flush(s.ctx, p[n:n+chunkSize]); err != nil {
				return n, s.fail(err)
			}
			n += chunkSize
			continue
		}
		if s.buf == nil {
			s.buf = chunkBufs.Get().(*[]byte)
		}
		k := min(len(p)-n, chunkSize-len(*s.buf))
		*s.buf = append(*s.buf, p[n:n+k]...)
		n += k
		if len(*s.buf) == chunkSize {
			if err := s.flush(s.ctx, *s.buf); err != nil {
				return n - k, s.fail(err)
			}
			s.release()
		}
	}
	return n, nil
}

// flush writes b at the end of the object, opening the transaction and
// creating the object on first use.
func (s *stage) flush(ctx context.Context, b []byte) error {
	if s.tx == nil {
		tx, err := s.e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT lo_from_bytea(0, $1)`, b).Scan(&s.oid); err != nil {
			rollback(tx)
			return err
		}
		s.tx = tx
	} else if _, err := s.tx.Exec(ctx, `SELECT lo_put($1, $2, $3)`, s.oid, s.off, b); err != nil {
		return err
	}
	s.off += int64(len(b))
	return nil
}

// fail makes err the stage's sticky error and rolls back at once, so a
// failed stage holds no connection while its caller gets round to Discard.
func (s *stage) fail(err error) error {
	s.err = s.e.wrap("stage write", blob.Digest{}, err)
	s.abort()
	return s.err
}

func (s *stage) release() {
	if s.buf != nil {
		*s.buf = (*s.buf)[:0]
		chunkBufs.Put(s.buf)
		s.buf = nil
	}
}

// abort rolls back the transaction, if any, and drops pending bytes.
func (s *stage) abort() {
	s.release()
	if s.tx != nil {
		rollback(s.tx)
		s.tx = nil
	}
}

// rollback ends tx. Its error is not reported: whether the rollback went
// through or the connection died (and the server aborted the transaction
// with it), nothing of the transaction remains.
func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx.Rollback(ctx)
}

// end marks the stage over and forgets it in the engine.
func (s *stage) end() {
	s.ended = true
	s.e.mu.Lock()
	delete(s.e.stages, s)
	s.e.mu.Unlock()
}

// Commit implements engines.Stage. The stage ends here whatever happens;
// on failure its transaction has rolled back.
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
	return nil
}

func (s *stage) commit(ctx context.Context, d blob.Digest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.buf != nil || s.tx == nil {
		var b []byte
		if s.buf != nil {
			b = *s.buf
		}
		if err := s.flush(ctx, notNil(b)); err != nil {
			return err
		}
		s.release()
	}
	tag, err := s.tx.Exec(ctx, `INSERT INTO pglo_blobs (digest, oid, size, sums) VALUES ($1, $2, $3, $4)
		ON CONFLICT (digest) DO NOTHING`, d[:], s.oid, s.off, s.sidecar)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		// Present already (dedup): the rollback takes our object with it.
		s.abort()
		return nil
	}
	tx := s.tx
	s.tx = nil
	if err := tx.Commit(ctx); err != nil {
		// pgx has ended the transaction; if the connection died during
		// COMMIT the outcome is unknown, so say so.
		return fmt.Errorf("commit (if the connection was lost, the entry may or may not be there): %w", err)
	}
	return nil
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

// SetSidecar implements engines.SidecarStage: stored in the sums column by
// Commit. A dedup Commit keeps the present entry's.
func (s *stage) SetSidecar(b []byte) {
	s.mu.Lock()
	s.sidecar = append([]byte(nil), b...)
	s.mu.Unlock()
}

func notNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
