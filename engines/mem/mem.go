package mem

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Engine is an in-memory pool. The zero value is not usable; call New.
type Engine struct {
	mu sync.RWMutex
	// m maps digest → value. Stored values are never mutated, so cursors
	// share them without copying. nil after Close.
	m map[blob.Digest][]byte

	// stages counts stages neither committed nor discarded.
	stages atomic.Int64

	// ledger is the corrupt ledger, the only part of the shared state a
	// mem store keeps in its engine: in the process, as long as its
	// blobs. It outlives Close, which only drops the blobs.
	ledger meta.MemLedger
}

var (
	_ engines.KV             = (*Engine)(nil)
	_ engines.Large          = (*Engine)(nil)
	_ engines.ResidueCounter = (*Engine)(nil)
	_ engines.DeleteSafe     = (*Engine)(nil)
	_ meta.Holder            = (*Engine)(nil)
)

// New returns an empty engine.
func New() *Engine {
	return &Engine{m: make(map[blob.Digest][]byte)}
}

// Meta implements meta.Holder: the corrupt ledger.
func (e *Engine) Meta() meta.State { return e.ledger.Meta() }

// Name implements engines.Engine.
func (e *Engine) Name() string { return "mem" }

// CursorsSurviveDelete implements engines.DeleteSafe: a cursor holds its
// value, not the map entry.
func (e *Engine) CursorsSurviveDelete() bool { return true }

// Has implements engines.Engine.
func (e *Engine) Has(ctx context.Context, d blob.Digest) (bool, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.m == nil {
		return false, blob.Wrap("has", e.Name(), d, blob.ErrClosed)
	}
	_, ok := e.m[d]
	return ok, nil
}

// Size implements engines.Engine.
func (e *Engine) Size(ctx context.Context, d blob.Digest) (int64, error) {
	v, err := e.value("size", d)
	if err != nil {
		return 0, err
	}
	return int64(len(v)), nil
}

// Open implements engines.Engine.
func (e *Engine) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	v, err := e.value("open", d)
	if err != nil {
		return nil, err
	}
	return engines.BytesCursor(v), nil
}

func (e *Engine) value(op string, d blob.Digest) ([]byte, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.m == nil {
		return nil, blob.Wrap(op, e.Name(), d, blob.ErrClosed)
	}
	v, ok := e.m[d]
	if !ok {
		return nil, blob.Wrap(op, e.Name(), d, blob.ErrMissing)
	}
	return v, nil
}

// Put implements engines.KV.
func (e *Engine) Put(ctx context.Context, d blob.Digest, value []byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, blob.Wrap("put", e.Name(), d, err)
	}
	// Copy before taking the lock: the copy is the slow part.
	return e.insert("put", d, bytes.Clone(value))
}

// insert stores v (owned by the engine from now on) unless d is present.
func (e *Engine) insert(op string, d blob.Digest, v []byte) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		return false, blob.Wrap(op, e.Name(), d, blob.ErrClosed)
	}
	if _, ok := e.m[d]; ok {
		return false, nil
	}
	if v == nil {
		v = []byte{}
	}
	e.m[d] = v
	return true, nil
}

// Delete implements engines.Engine.
func (e *Engine) Delete(ctx context.Context, d blob.Digest) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		return blob.Wrap("delete", e.Name(), d, blob.ErrClosed)
	}
	if _, ok := e.m[d]; !ok {
		return blob.Wrap("delete", e.Name(), d, blob.ErrMissing)
	}
	delete(e.m, d)
	return nil
}

// StageResidue implements engines.ResidueCounter: the number of open stages.
func (e *Engine) StageResidue(ctx context.Context) (int, error) {
	return int(e.stages.Load()), nil
}

// Close drops every value. Open cursors keep reading what they opened.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m = nil
	return nil
}

// Ephemeral implements engines.Ephemeral: everything is gone when the
// process exits.
func (e *Engine) Ephemeral() bool { return true }
