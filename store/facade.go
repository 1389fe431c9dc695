package store

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/group"
)

// The collector's types that the surfaces use, re-exported so that they
// import the store alone (like Digest and Pin).
type (
	// Report is a sweep's report (gc.Report).
	Report = gc.Report
	// Totals sums the sweeps of a process (gc.Totals).
	Totals = gc.Totals
	// AbortCause says why a sweep deleted nothing on purpose.
	AbortCause = gc.AbortCause
	// Source is a liveness source (gc.Source).
	Source = gc.Source
	// Registration is a registered Source; Deregister ends it.
	Registration = gc.Registration
	// Protect is the embedder's protect callback (gc.Protect).
	Protect = gc.Protect
	// Clock is the GC's in-process clock (gc.Clock).
	Clock = gc.Clock
	// Hurry ends the linger of a lazy commit (a settle) for whoever waits
	// on it (group.Hurry).
	Hurry = group.Hurry
)

// WithHurry returns ctx carrying h, for a call whose commit may linger
// (group.WithHurry).
func WithHurry(ctx context.Context, h *Hurry) context.Context { return group.WithHurry(ctx, h) }

// RealClock is the wall clock.
var RealClock = gc.RealClock

// ReleaseAll releases every pin of ps (gc.ReleaseAll).
func ReleaseAll(ps []*Pin) { gc.ReleaseAll(ps) }

// Register adds a liveness source: until it is deregistered, every sweep
// and direct delete consults it.
func (s *Store) Register(src Source) *Registration { return s.gc.Register(src) }

// SetProtect installs the protect callback, consulted once per sweep.
func (s *Store) SetProtect(p Protect) { s.gc.SetProtect(p) }

// PinTTL is the life of an unrenewed pin row (Config.PinTTL, defaulted).
func (s *Store) PinTTL() time.Duration { return s.gc.PinTTL() }

// LastReport is the report of the last sweep this process ran, if any.
func (s *Store) LastReport() (Report, bool) { return s.gc.LastReport() }

// EngineNames names the engines of the tiers ("" for a tier the store
// does not have), for messages and a mount's source. A PostgreSQL name
// is user@host:port/database, never a password.
func (s *Store) EngineNames() (kv, large string) {
	if s.kv != nil {
		kv = s.kv.Name()
	}
	if s.large != nil {
		large = s.large.Name()
	}
	return kv, large
}

// FSUsage is the capacity of the filesystem that holds the large tier's
// files, for df.
type FSUsage struct {
	Dir                   string // the large tier's directory
	Blocks, Bfree, Bavail uint64 // in Frsize units
	Files, Ffree          uint64
	Bsize, Frsize         int64
}

// StatFS reports the filesystem under the large tier's files; ok is false
// when the large tier is not files on this host (none, mem, pglo, S3).
func (s *Store) StatFS() (u FSUsage, ok bool, err error) {
	sf, isFS := s.large.(engines.StatFS)
	if s.large == nil || !isFS {
		return FSUsage{}, false, nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(sf.Root(), &st); err != nil {
		return FSUsage{}, true, fmt.Errorf("statfs %s: %w", sf.Root(), err)
	}
	return FSUsage{Dir: sf.Root(), Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail, Files: st.Files, Ffree: st.Ffree,
		Bsize: st.Bsize, Frsize: st.Frsize}, true, nil
}

// TierSize is what one tier holds.
type TierSize struct {
	Tier  Tier
	Blobs int64
	Bytes int64
}

// TierSizes counts each tier's blobs and bytes by listing it (a full
// listing: call it rarely, as the metrics do, in the background). A tier
// whose listing fails is left out, and its error returned with the others.
func (s *Store) TierSizes(ctx context.Context) ([]TierSize, error) {
	var out []TierSize
	var errs []error
	for _, t := range s.tiers() {
		ts := TierSize{Tier: t.tier}
		var lerr error
		for e, err := range t.e.List(ctx, Digest{}) {
			if err != nil {
				lerr = err
				break
			}
			ts.Blobs++
			ts.Bytes += e.Size
		}
		if lerr != nil {
			errs = append(errs, lerr)
			continue
		}
		out = append(out, ts)
	}
	return out, errors.Join(errs...)
}
