package meta

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// MemLedger is the corrupt ledger of a mem engine: in the process, as long
// as the engine's blobs (a mem engine's state is nothing else: its pins,
// arbitration and window are the collector's, in the process). The zero
// value is an empty ledger. Marked is the process's wall clock.
type MemLedger struct {
	mu    sync.Mutex
	marks map[blob.Digest]Mark
}

var _ Ledger = (*MemLedger)(nil)

// Meta is the ledger as a State: its only part.
func (l *MemLedger) Meta() State { return State{Ledger: l} }

// MarkCorrupt implements Ledger.
func (l *MemLedger) MarkCorrupt(ctx context.Context, d blob.Digest, file []byte, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.marks == nil {
		l.marks = make(map[blob.Digest]Mark)
	}
	l.marks[d] = Mark{Digest: d, File: bytes.Clone(file), Reason: reason, Marked: time.Now()}
	return nil
}

// CorruptMark implements Ledger.
func (l *MemLedger) CorruptMark(ctx context.Context, d blob.Digest) (Mark, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.marks[d]
	m.File = bytes.Clone(m.File)
	return m, ok, nil
}

// ClearCorrupt implements Ledger.
func (l *MemLedger) ClearCorrupt(ctx context.Context, d blob.Digest, file []byte) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.marks[d]
	if !ok || !bytes.Equal(m.File, file) {
		return false, nil
	}
	delete(l.marks, d)
	return true, nil
}

// CorruptMarks implements Ledger.
func (l *MemLedger) CorruptMarks(ctx context.Context) ([]Mark, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Mark, 0, len(l.marks))
	for _, m := range l.marks {
		m.File = bytes.Clone(m.File)
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Mark) int { return a.Digest.Compare(b.Digest) })
	return out, nil
}
