package mem

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

var _ engines.CorruptLedger = (*Engine)(nil)

// ledger is the engine's engines.CorruptLedger: in the process, as long as
// its blobs. It outlives Close, which only drops the blobs.
type ledger map[blob.Digest]engines.CorruptMark

// MarkCorrupt implements engines.CorruptLedger.
func (e *Engine) MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error {
	e.lmu.Lock()
	defer e.lmu.Unlock()
	if e.corrupt == nil {
		e.corrupt = make(ledger)
	}
	e.corrupt[d] = engines.CorruptMark{Digest: d, File: bytes.Clone(file), Reason: reason, Marked: time.Now()}
	return nil
}

// CorruptMark implements engines.CorruptLedger.
func (e *Engine) CorruptMark(ctx context.Context, d blob.Digest) (engines.CorruptMark, bool, error) {
	e.lmu.Lock()
	defer e.lmu.Unlock()
	m, ok := e.corrupt[d]
	m.File = bytes.Clone(m.File)
	return m, ok, nil
}

// ClearCorrupt implements engines.CorruptLedger.
func (e *Engine) ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error) {
	e.lmu.Lock()
	defer e.lmu.Unlock()
	m, ok := e.corrupt[d]
	if !ok || !bytes.Equal(m.File, file) {
		return false, nil
	}
	delete(e.corrupt, d)
	return true, nil
}

// CorruptMarks implements engines.CorruptLedger.
func (e *Engine) CorruptMarks(ctx context.Context) ([]engines.CorruptMark, error) {
	e.lmu.Lock()
	defer e.lmu.Unlock()
	out := make([]engines.CorruptMark, 0, len(e.corrupt))
	for _, m := range e.corrupt {
		m.File = bytes.Clone(m.File)
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b engines.CorruptMark) int { return a.Digest.Compare(b.Digest) })
	return out, nil
}
