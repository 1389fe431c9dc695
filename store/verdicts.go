package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Verification memory: what the last end-to-end check of a blob found,
// about the backing file as it was then (engines.FileID: device, inode,
// size, mtime, ctime; empty for a blob that is not a file).
//
//   - corrupt: a scrub found the content does not match the digest. Kept
//     in the ledger (ledger below): every process that opens the store
//     refuses the blob at Get with ErrCorrupt, before a byte is served,
//     while its file is the one found corrupt.
//   - suspect: a corrupt blob whose file changed since (a restore, or just
//     a chmod). It is served only verified: no passthrough, no Trust,
//     until a reader that checked every byte, or a scrub, finds it good,
//     which clears the ledger's record.
//   - good: a local blob that a reader or a scrub verified end to end, as
//     the file it is now. It only enables passthrough in --verify=full, so
//     it stays in the process (goodVerdicts), and is bounded: when full it
//     starts over, which costs a re-verification, never a wrong byte.
//
// A repair clears a corrupt record: the right content put again replaces
// the stored copy (put.go: repair), and a changed file that verifies good
// clears it as said above. Nothing else does: a good verdict never evicts
// a corrupt one.

// fileIdent is the ledger's form of a file identity: the fields of
// engines.FileID, little-endian; empty for a blob that is not a file.
func fileIdent(id engines.FileID, isFile bool) []byte {
	if !isFile {
		return []byte{}
	}
	b := make([]byte, 0, 56)
	for _, v := range []uint64{id.Dev, id.Ino, uint64(id.Size),
		uint64(id.Mtime.Sec), uint64(id.Mtime.Nsec), uint64(id.Ctime.Sec), uint64(id.Ctime.Nsec)} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// cursorFile is the identity of c's backing file, if it is one.
func cursorFile(c engines.Cursor) (engines.FileID, bool) { return engines.CursorFileID(c) }

// verifiedFiller is a large engine that publishes local files it has
// hashed whole to their digest (engines/cache's fills): each one it
// reports is known good as that file, as after a read that checked it
// whole.
type verifiedFiller interface {
	OnVerified(func(d Digest, id engines.FileID))
}

// goodVerdicts is the in-process memory of blobs verified end to end, and
// of the suspect blobs this process has already reported as changed.
type goodVerdicts struct {
	mu       sync.Mutex
	good     map[Digest]engines.FileID
	reported map[Digest]bool // suspect blobs whose change was logged
}

const goodMax = 1 << 16

func (v *goodVerdicts) record(d Digest, id engines.FileID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.good == nil || len(v.good) >= goodMax {
		v.good = make(map[Digest]engines.FileID)
	}
	v.good[d] = id
	delete(v.reported, d)
}

func (v *goodVerdicts) forget(d Digest) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.good, d)
}

// check reports whether d is known good as file id; changed reports that
// a good verdict was about another version of the file (it is forgotten).
func (v *goodVerdicts) check(d Digest, id engines.FileID) (good, changed bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	was, ok := v.good[d]
	switch {
	case !ok:
		return false, false
	case was != id:
		delete(v.good, d)
		return false, true
	}
	return true, false
}

// suspectSeen reports whether this process already saw d as suspect
// (the change is reported once, as it was when the verdict turned).
func (v *goodVerdicts) suspectSeen(d Digest) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.good, d)
	if v.reported[d] {
		return true
	}
	if v.reported == nil {
		v.reported = make(map[Digest]bool)
	}
	v.reported[d] = true
	return false
}

// ledger is the record of corrupt blobs. Design point (its home): the kv
// engine's meta.Ledger, gc_corrupt beside gc_pins on SQLite and
// PostgreSQL — the one database every process and fleet host of the pool
// already opens, with the GC state, so a mount, serve and the CLI read the
// same record without a daemon to ask, and a repair in any of them is seen
// by all. Not a file beside the blobs: pglo and S3 blobs have none, and a
// fleet shares the database, not always the medium. Without a kv engine
// that keeps one (--kv none), or where its database cannot be written
// (read-only media), marks stay in this process (local), as pins do.
type ledger struct {
	shared   meta.Ledger // nil: none
	writable bool        // shared takes marks

	mu    sync.Mutex
	local map[Digest]meta.Mark
}

func (l *ledger) get(ctx context.Context, d Digest) (meta.Mark, bool, error) {
	l.mu.Lock()
	m, ok := l.local[d]
	l.mu.Unlock()
	if ok || l.shared == nil {
		return m, ok, nil
	}
	return l.shared.CorruptMark(ctx, d)
}

func (l *ledger) mark(ctx context.Context, d Digest, file []byte, reason string) error {
	if l.shared != nil && l.writable {
		return l.shared.MarkCorrupt(ctx, d, file, reason)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.local == nil {
		l.local = make(map[Digest]meta.Mark)
	}
	l.local[d] = meta.Mark{Digest: d, File: bytes.Clone(file), Reason: reason, Marked: time.Now()}
	return nil
}

// clear drops d's mark if it still names file.
func (l *ledger) clear(ctx context.Context, d Digest, file []byte) error {
	l.mu.Lock()
	if m, ok := l.local[d]; ok && bytes.Equal(m.File, file) {
		delete(l.local, d)
	}
	l.mu.Unlock()
	if l.shared == nil || !l.writable {
		return nil
	}
	_, err := l.shared.ClearCorrupt(ctx, d, file)
	return err
}

func (l *ledger) list(ctx context.Context) ([]meta.Mark, error) {
	var out []meta.Mark
	if l.shared != nil {
		ms, err := l.shared.CorruptMarks(ctx)
		if err != nil {
			return nil, err
		}
		out = ms
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.local {
		out = append(out, m)
	}
	return out, nil
}

// CorruptBlob is a blob the store refuses: a scrub found it corrupt.
type CorruptBlob struct {
	Digest Digest    `json:"digest"`
	Reason string    `json:"reason"` // what the scrub found (may name the engine)
	Marked time.Time `json:"marked"` // when, on the ledger's clock
}

// Corrupt lists the blobs the store knows to be corrupt, which Get refuses
// (or, when their file has changed since, serves only verified).
func (s *Store) Corrupt(ctx context.Context) ([]CorruptBlob, error) {
	ms, err := s.ledger.list(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]CorruptBlob, len(ms))
	for i, m := range ms {
		out[i] = CorruptBlob{Digest: m.Digest, Reason: m.Reason, Marked: m.Marked}
	}
	return out, nil
}

// corruptError is Get's refusal of a blob the ledger marks corrupt. It
// names the digest and what to do, never an engine or a path: it is what
// an HTTP client is told.
func corruptError(d Digest, m meta.Mark) error {
	when := ""
	if !m.Marked.IsZero() {
		when = " on " + m.Marked.UTC().Format(time.RFC3339)
	}
	return blob.Wrap("get", "", d, fmt.Errorf("%w (%w): a scrub or a read found it so%s; it is refused until the right content is put again", ErrCorrupt, ErrVerification, when))
}

// judge sets what the store knows of r's blob as its file is now, at Get
// and at Recheck: a blob marked corrupt as this very file is refused; one
// whose file changed since it was marked is suspect; a good verdict about
// this file allows passthrough.
func (r *Reader) judge(ctx context.Context) error {
	id, isFile := cursorFile(r.cur)
	r.fileNow, r.isFile = id, isFile
	r.suspect, r.good, r.changed, r.markFile = false, false, false, nil
	m, marked, err := r.s.ledger.get(ctx, r.d)
	if err != nil {
		return blob.Wrap("get", r.engine, r.d, fmt.Errorf("read the corrupt ledger: %w", err))
	}
	if marked {
		if bytes.Equal(m.File, fileIdent(id, isFile)) {
			// Debug: the error says it all, and each surface reports it
			// its own way (the mount logs every EIO).
			r.s.log.Debug("blob was found corrupt and has not changed since; refusing to serve it",
				"digest", r.d.String(), "engine", r.engine, "marked", m.Marked, "reason", m.Reason)
			return corruptError(r.d, m)
		}
		r.suspect, r.markFile = true, m.File
		if !r.s.verdicts.suspectSeen(r.d) {
			r.changed = true
			r.s.log.Warn("blob file changed on disk since it was found corrupt; verifying it before serving it",
				"digest", r.d.String(), "engine", r.engine)
		}
		return nil
	}
	if isFile {
		r.good, r.changed = r.s.verdicts.check(r.d, id)
		if r.changed {
			r.s.log.Warn("blob file changed on disk since it was last verified; verifying it again before serving it",
				"digest", r.d.String(), "engine", r.engine)
		}
	}
	return nil
}

// verifiedWhole records, once per reader, that every byte of the blob was
// checked, as its file is now: a good verdict, and the end of a suspect
// blob's corrupt record. A file that changed while it was read (its
// chunks were checked across the change) records nothing.
func (r *Reader) verifiedWhole() {
	if r.tier != TierLarge || r.whole.Swap(true) {
		return
	}
	id, isFile := cursorFile(r.cur)
	r.jmu.Lock()
	was, wasFile, markFile := r.fileNow, r.isFile, r.markFile
	r.jmu.Unlock()
	if isFile != wasFile || isFile && id != was {
		return
	}
	if isFile {
		r.s.verdicts.record(r.d, id)
	}
	if markFile != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.s.ledger.clear(ctx, r.d, markFile); err != nil {
			r.s.log.Warn("blob verified good again, but its corrupt record stays", "digest", r.d.String(), "err", err)
			return
		}
		r.s.log.Info("blob once found corrupt verified good as its file is now", "digest", r.d.String())
	}
}

// recordScrub keeps what a scrub found: a corrupt blob is marked in the
// ledger (unless its file changed while it was read: the verdict is about
// no one version); an intact one is good and ends any mark.
func (s *Store) recordScrub(ctx context.Context, res ScrubResult, id engines.FileID, stable, isFile bool, mark *meta.Mark) {
	d := res.Digest
	switch res.Status {
	case ScrubOK:
		if isFile && stable {
			s.verdicts.record(d, id)
		}
		if mark != nil && (stable || !isFile) {
			if err := s.ledger.clear(ctx, d, mark.File); err != nil {
				s.log.Warn("scrub found a blob good again, but its corrupt record stays", "digest", d.String(), "err", err)
			}
		}
	case ScrubCorrupt:
		s.verdicts.forget(d)
		if isFile && !stable {
			return
		}
		if err := s.ledger.mark(ctx, d, fileIdent(id, isFile), res.Error); err != nil {
			s.log.Error("scrub found a blob corrupt but could not record it; other processes will serve it verified", "digest", d.String(), "err", err)
		}
	}
}
