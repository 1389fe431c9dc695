package store

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
)

// DefaultThreshold is the largest blob the kv tier holds whole. 128 KiB
// keeps kv rows small enough to materialize on every read while sending
// anything worth streaming to the large tier.
const DefaultThreshold = 128 << 10

// DefaultUploadMemory bounds what uploads (files being written into a
// mount's incoming/) keep in memory together before they spill to disk:
// 2 048 uploads of 128 KiB at once.
const DefaultUploadMemory = 256 << 20

// Mode names a tier layout.
type Mode string

const (
	// ModeMemOnly: one mem kv engine, no large tier. Ephemeral.
	ModeMemOnly Mode = "mem-only"
	// ModeKVOnly: a kv engine alone; puts over the threshold are rejected
	// with ErrTooLarge at put time.
	ModeKVOnly Mode = "kv-only"
	// ModeDualTier: kv engine for blobs ≤ threshold, large engine above.
	ModeDualTier Mode = "dual-tier"
	// ModeLargeOnly: a large engine alone holds every blob.
	ModeLargeOnly Mode = "large-only"
)

// Tier says which tier holds a blob.
type Tier string

const (
	TierKV    Tier = "kv"
	TierLarge Tier = "large"
)

// Config configures Open. The store takes ownership of the engines and
// closes them in Close.
type Config struct {
	KV    engines.KV    // nil: no kv tier
	Large engines.Large // nil: no large tier
	// Mode, if set, must agree with the engines given; it is derived
	// otherwise.
	Mode Mode
	// Threshold is the kv tier's size limit; 0 means DefaultThreshold.
	Threshold int64
	// GCDelay is the delete window (see package gc).
	GCDelay time.Duration
	// Clock is the GC's in-process clock (gc.Options.Clock): it times the
	// in-process window and reports, never a row another process reads
	// (pin expiries and the durable window are the database's clock). nil
	// means the wall clock.
	Clock  gc.Clock
	Logger *slog.Logger
	// ScratchDir holds upload scratch files when the large engine cannot
	// stage random-access writes itself (created 0700 when first needed);
	// "" means os.TempDir(). Scratch files have no name: a crash leaves
	// nothing there.
	ScratchDir string
	// UploadMemory bounds the bytes all uploads of this store keep in
	// memory; past it an upload spills into its stage or a scratch file.
	// 0 means DefaultUploadMemory.
	UploadMemory int64
	// PinTTL is the life of an unrenewed pin row (gc.Options.PinTTL).
	PinTTL time.Duration
	// Fleet declares that several hosts share this pool (docs/gc.md, fleet
	// mode). It is never inferred; Open refuses it for any configuration
	// that cannot be shared (see checkFleet).
	Fleet bool
	// SharedMedia declares that a local large tier sits on storage every
	// fleet host mounts at the same path. Required for Fleet with local.
	SharedMedia bool
	// SyncEvery bounds what a power loss takes: an engine that commits
	// without syncing (SQLite) is synced this often while it is written
	// (sync.go). 0 means DefaultSyncEvery; negative turns the timer off
	// (Sync and Close still sync).
	SyncEvery time.Duration
}

// Store is the facade. It is safe for concurrent use.
type Store struct {
	kv        engines.KV
	large     engines.Large
	mode      Mode
	threshold int64
	gc        *gc.Collector
	log       *slog.Logger
	scratch   string
	closed    atomic.Bool
	// uploadMem is the memory uploads hold now; uploadCap bounds it.
	uploadMem atomic.Int64
	uploadCap int64
	stats     counters
	// readOnly: an engine was opened on read-only media. Reads work;
	// puts, deletes and sweeps return ErrReadOnly; pins stay in this
	// process when the kv engine is the read-only one (no pin row can be
	// written).
	readOnly bool
	// syncs is the timer that syncs the engines every Config.SyncEvery;
	// nil when off.
	syncs *syncTimer
	// Verification memory (verdicts.go): blobs known good in this
	// process, and the ledger of blobs found corrupt.
	verdicts goodVerdicts
	ledger   ledger
	// rightSums: checksums recomputed for blobs whose own are damaged.
	rightSums rightSums
}

type counters struct {
	puts, dedups, bytesIn, reads, bytesOut atomic.Int64
}

// Open validates cfg and returns a store over its engines.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	s := &Store{kv: cfg.KV, large: cfg.Large, threshold: cfg.Threshold, log: cfg.Logger, scratch: cfg.ScratchDir}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.threshold == 0 {
		s.threshold = DefaultThreshold
	}
	if s.uploadCap = cfg.UploadMemory; s.uploadCap <= 0 {
		s.uploadCap = DefaultUploadMemory
	}
	if s.threshold < 0 {
		return nil, fmt.Errorf("store: threshold %d: must not be negative", s.threshold)
	}
	mode, err := deriveMode(cfg)
	if err != nil {
		return nil, err
	}
	s.mode = mode
	if cfg.Fleet {
		if err := checkFleet(cfg); err != nil {
			return nil, err
		}
	}
	if _, err := gc.VisibleAfter(time.Now(), cfg.GCDelay); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// Design point (GC-state home): one per store, the kv engine when it
	// can host it (SQLite, PostgreSQL): pin rows, the arbitration lock and
	// the sweep lease live with the namespaces they arbitrate against.
	// Otherwise (mem, or no kv tier) everything stays in this process.
	kvReadOnly := false
	for _, e := range []engines.Engine{cfg.KV, cfg.Large} {
		if r, ok := e.(engines.ReadOnly); ok && r.ReadOnly() {
			s.readOnly = true
			kvReadOnly = kvReadOnly || e == engines.Engine(cfg.KV)
		}
	}
	// The shared state is the kv engine's (package meta owns it), or for
	// the delete window alone, the large engine's.
	var kvState, largeState meta.State
	if h, ok := cfg.KV.(meta.Holder); ok {
		kvState = h.Meta()
	}
	if h, ok := cfg.Large.(meta.Holder); ok {
		largeState = h.Meta()
	}
	var host meta.Host
	// Pin rows need a writable kv database; a read-only large tier alone
	// (a fleet reader host) still publishes its pins there.
	if kvState.Host != nil && !kvReadOnly {
		if _, ok := cfg.KV.(meta.Putter); !ok {
			return nil, fmt.Errorf("store: kv engine %s hosts GC state but cannot commit a put's rows with its entry", cfg.KV.Name())
		}
		host = kvState.Host
	}
	// One window per instance: the kv engine's when it keeps one,
	// otherwise the large engine's, otherwise the in-process window.
	window := kvState.Window
	if window == nil {
		window = largeState.Window
	}
	if kvState.Ledger != nil {
		s.ledger.shared, s.ledger.writable = kvState.Ledger, !kvReadOnly
	}
	if v, ok := cfg.Large.(verifiedFiller); ok {
		v.OnVerified(s.verdicts.record)
	}
	s.gc = gc.New(pool{s}, gc.Options{Window: window, Delay: cfg.GCDelay, Host: host, PinTTL: cfg.PinTTL,
		Clock: cfg.Clock, Logger: s.log})
	s.syncs = s.startSyncTimer(cfg.SyncEvery)
	return s, nil
}

func deriveMode(cfg Config) (Mode, error) {
	var m Mode
	switch {
	case cfg.KV == nil && cfg.Large == nil:
		return "", errors.New("store: no engine configured: need a kv engine, a large engine or both")
	case cfg.KV != nil && cfg.Large != nil:
		m = ModeDualTier
	case cfg.KV != nil:
		m = ModeKVOnly
		if cfg.Mode == ModeMemOnly {
			m = ModeMemOnly
		}
	default:
		m = ModeLargeOnly
	}
	if cfg.Mode != "" && cfg.Mode != m {
		return "", fmt.Errorf("store: mode %q does not match the engines given (kv=%v, large=%v)", cfg.Mode, cfg.KV != nil, cfg.Large != nil)
	}
	return m, nil
}

// ReadOnly reports whether the store was opened on read-only media.
func (s *Store) ReadOnly() bool { return s.readOnly }

// writable returns ErrReadOnly, wrapped for op, on a read-only store.
func (s *Store) writable(op string) error {
	if s.readOnly {
		return fmt.Errorf("%s: %w: its data is on a read-only filesystem, or in a directory this user cannot write", op, ErrReadOnly)
	}
	return nil
}

// Mode is the tier layout.
func (s *Store) Mode() Mode { return s.mode }

// Threshold is the kv tier's size limit.
func (s *Store) Threshold() int64 { return s.threshold }

// Pin mints a pin on d (see gc.Collector.Pin).
func (s *Store) Pin(ctx context.Context, d Digest) (*gc.Pin, error) { return s.gc.Pin(ctx, d) }

// PinMany mints a pin on each of ds (see gc.Collector.PinMany).
func (s *Store) PinMany(ctx context.Context, ds []Digest) ([]*gc.Pin, error) {
	return s.gc.PinMany(ctx, ds)
}

// Sweep runs one garbage collection (see gc.Collector.Sweep).
func (s *Store) Sweep(ctx context.Context) (gc.Report, error) {
	if s.closed.Load() {
		return gc.Report{}, ErrClosed
	}
	if err := s.writable("sweep"); err != nil {
		return gc.Report{}, err
	}
	return s.gc.Sweep(ctx)
}

// Delete removes d unless liveness protects it (ErrGcRefuse). An absent key
// returns ErrMissing.
func (s *Store) Delete(ctx context.Context, d Digest) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.writable("delete"); err != nil {
		return err
	}
	return s.gc.Delete(ctx, d)
}

// ForceDelete is Delete for a store without liveness sources, where the
// caller vouches that nothing refers to d (gc.Collector.ForceDelete).
func (s *Store) ForceDelete(ctx context.Context, d Digest) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.writable("delete"); err != nil {
		return err
	}
	return s.gc.ForceDelete(ctx, d)
}

// Info describes a stored blob.
type Info struct {
	Digest Digest `json:"digest"`
	Size   int64  `json:"size"`
	Tier   Tier   `json:"tier"`
}

// Stat returns d's size and tier from metadata. A miss is ok=false.
func (s *Store) Stat(ctx context.Context, d Digest) (Info, bool, error) {
	info, ok, err := s.statTiers(ctx, d)
	if ok || err != nil {
		return info, ok, err
	}
	again, err := s.lostErr(ctx, "stat", d)
	if err != nil || !again {
		return Info{}, false, err
	}
	return s.statTiers(ctx, d) // put since the miss (lostErr)
}

// statTiers is Stat of the first tier that holds d; ok is false when none
// does.
func (s *Store) statTiers(ctx context.Context, d Digest) (Info, bool, error) {
	for _, t := range s.tiers() {
		n, err := t.e.Size(ctx, d)
		if err == nil {
			return Info{Digest: d, Size: n, Tier: t.tier}, true, nil
		}
		if !errors.Is(err, ErrMissing) {
			return Info{}, false, err
		}
	}
	return Info{}, false, nil
}

// Size returns d's logical size from metadata, or an error wrapping
// ErrMissing if no tier holds it. It is what a namespace link charges to
// the namespace's usage (namespaces.Pool).
func (s *Store) Size(ctx context.Context, d Digest) (int64, error) {
	info, ok, err := s.statTiers(ctx, d)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, blob.Wrap("size", "store", d, ErrMissing)
	}
	return info.Size, nil
}

// StatMany is Stat for many digests, with one query per tier whose engine
// is an engines.BatchSizer (a listing of a namespace asks for a page at a
// time). A digest no tier holds is absent from the map.
func (s *Store) StatMany(ctx context.Context, ds []Digest) (map[Digest]Info, error) {
	out := make(map[Digest]Info, len(ds))
	rest := ds
	for _, t := range s.tiers() {
		if len(rest) == 0 {
			break
		}
		var missing []Digest
		if bs, ok := t.e.(engines.BatchSizer); ok {
			sizes, err := bs.SizeMany(ctx, rest)
			if err != nil {
				return nil, err
			}
			for i, d := range rest {
				if sizes[i] >= 0 {
					out[d] = Info{Digest: d, Size: sizes[i], Tier: t.tier}
				} else {
					missing = append(missing, d)
				}
			}
		} else {
			for _, d := range rest {
				n, err := t.e.Size(ctx, d)
				switch {
				case err == nil:
					out[d] = Info{Digest: d, Size: n, Tier: t.tier}
				case errors.Is(err, ErrMissing):
					missing = append(missing, d)
				default:
					return nil, err
				}
			}
		}
		rest = missing
	}
	return out, nil
}

// HasMany is Has for many digests, by StatMany's batched queries.
func (s *Store) HasMany(ctx context.Context, ds []Digest) ([]bool, error) {
	infos, err := s.StatMany(ctx, ds)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(ds))
	for i, d := range ds {
		_, out[i] = infos[d]
	}
	return out, nil
}

// Has reports whether d is in the pool.
func (s *Store) Has(ctx context.Context, d Digest) (bool, error) {
	for _, t := range s.tiers() {
		ok, err := t.e.Has(ctx, d)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

type tier struct {
	tier Tier
	e    engines.Engine
}

// tiers lists the engines in fall-through order.
func (s *Store) tiers() []tier {
	ts := make([]tier, 0, 2)
	if s.kv != nil {
		ts = append(ts, tier{TierKV, s.kv})
	}
	if s.large != nil {
		ts = append(ts, tier{TierLarge, s.large})
	}
	return ts
}

// List streams every digest in the pool in ascending order, merging the
// tiers (a digest present in both is listed once).
func (s *Store) List(ctx context.Context) iter.Seq2[engines.Entry, error] {
	ts := s.tiers()
	if len(ts) == 1 {
		return ts[0].e.List(ctx, Digest{})
	}
	return mergeLists(ts[0].e.List(ctx, Digest{}), ts[1].e.List(ctx, Digest{}))
}

func mergeLists(a, b iter.Seq2[engines.Entry, error]) iter.Seq2[engines.Entry, error] {
	return func(yield func(engines.Entry, error) bool) {
		na, sa := iter.Pull2(a)
		defer sa()
		nb, sb := iter.Pull2(b)
		defer sb()
		ea, erra, oka := na()
		eb, errb, okb := nb()
		for oka || okb {
			if oka && erra != nil {
				yield(engines.Entry{}, erra)
				return
			}
			if okb && errb != nil {
				yield(engines.Entry{}, errb)
				return
			}
			var e engines.Entry
			switch {
			case !okb || oka && ea.Digest.Compare(eb.Digest) < 0:
				e = ea
				ea, erra, oka = na()
			case !oka || eb.Digest.Compare(ea.Digest) < 0:
				e = eb
				eb, errb, okb = nb()
			default: // in both tiers: list once
				e = ea
				ea, erra, oka = na()
				eb, errb, okb = nb()
			}
			if !yield(e, nil) {
				return
			}
		}
	}
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	Mode      Mode  `json:"mode"`
	Threshold int64 `json:"threshold"`
	Puts      int64 `json:"puts"`
	Dedups    int64 `json:"dedups"`
	BytesIn   int64 `json:"bytes_in"`
	Reads     int64 `json:"reads"`
	BytesOut  int64 `json:"bytes_out"`
	Pinned    int   `json:"pinned_digests"`
	Pins      int   `json:"pins"`
	// PinOwner names this process's gc_pins rows ("" when pins are not
	// shared); PinsLapsed counts rows found expired at renewal.
	PinOwner   string `json:"pin_owner,omitempty"`
	PinsLapsed int64  `json:"pins_lapsed"`
	// UploadMemory is what uploads hold in memory now (at most
	// Config.UploadMemory).
	UploadMemory int64 `json:"upload_memory_bytes"`
	// Sweeps sums every sweep this process ran on the store.
	Sweeps gc.Totals `json:"sweeps"`
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	pd, pn := s.gc.PinCount()
	st := Stats{
		Mode: s.mode, Threshold: s.threshold,
		Puts: s.stats.puts.Load(), Dedups: s.stats.dedups.Load(), BytesIn: s.stats.bytesIn.Load(),
		Reads: s.stats.reads.Load(), BytesOut: s.stats.bytesOut.Load(),
		Pinned: pd, Pins: pn, PinsLapsed: s.gc.Lapsed(),
		UploadMemory: s.uploadMem.Load(), Sweeps: s.gc.Totals(),
	}
	if s.gc.Shared() {
		st.PinOwner = s.gc.Owner()
	}
	return st
}

// Close stops the collector (its pin rows are deleted), syncs and closes
// the engines. Further calls fail with ErrClosed.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.syncs.close()
	errs := []error{s.gc.Close(), s.syncEngines(context.Background())}
	for _, t := range s.tiers() {
		errs = append(errs, t.e.Close())
	}
	return errors.Join(errs...)
}

// pool adapts the store to gc.Pool, gc.BatchPool and gc.OutsidePool.
type pool struct{ s *Store }

var (
	_ gc.BatchPool   = pool{}
	_ gc.OutsidePool = pool{}
)

func (p pool) List(ctx context.Context) iter.Seq2[engines.Entry, error] { return p.s.List(ctx) }

// Delete removes d from every tier that holds it (a blob can sit in both
// if the threshold changed between runs).
func (p pool) Delete(ctx context.Context, d Digest) (int64, error) {
	var freed int64
	found := false
	for _, t := range p.s.tiers() {
		n, err := t.e.Size(ctx, d)
		if errors.Is(err, ErrMissing) {
			continue
		}
		if err != nil {
			return freed, err
		}
		if err := t.e.Delete(ctx, d); err != nil {
			if errors.Is(err, ErrMissing) {
				continue
			}
			return freed, err
		}
		found = true
		freed += n
	}
	if !found {
		return 0, blob.Wrap("delete", "", d, ErrMissing)
	}
	return freed, nil
}

// DeleteMany removes each of ds from every tier that holds it, with one
// transaction per tier whose engine is an engines.BatchDeleter. sizes[i]
// is -1 for a digest no tier held.
func (p pool) DeleteMany(ctx context.Context, ds []Digest) ([]int64, error) {
	sizes := make([]int64, len(ds))
	for i := range sizes {
		sizes[i] = -1
	}
	for _, t := range p.s.tiers() {
		got, err := deleteFrom(ctx, t.e, ds)
		if err != nil {
			return nil, err
		}
		addSizes(sizes, got)
	}
	return sizes, nil
}

// addSizes adds a tier's delete sizes (-1: not there) into sizes (-1:
// nowhere yet).
func addSizes(sizes, got []int64) {
	for i, n := range got {
		if n >= 0 {
			sizes[i] = max(sizes[i], 0) + n
		}
	}
}

// Outside implements gc.OutsidePool: the large tier is outside the host's
// transactions. The kv tier's rows are the host's to delete: it is the kv
// engine's state (meta.Host.Arbitrate deletes them with the statement the
// engine gave it).
func (p pool) Outside() bool { return p.s.large != nil }

// DeleteOutside implements gc.OutsidePool: the large tier's deletes, which the
// collector runs once the kv rows' delete has committed, under the
// arbitration lock again.
func (p pool) DeleteOutside(ctx context.Context, ds []Digest) ([]int64, error) {
	if p.s.large == nil {
		sizes := make([]int64, len(ds))
		for i := range sizes {
			sizes[i] = -1
		}
		return sizes, nil
	}
	return deleteFrom(ctx, p.s.large, ds)
}

// deleteFrom deletes ds from e, in one transaction where e is an
// engines.BatchDeleter, and returns each size or -1.
func deleteFrom(ctx context.Context, e engines.Engine, ds []Digest) ([]int64, error) {
	if bd, ok := e.(engines.BatchDeleter); ok {
		return bd.DeleteMany(ctx, ds)
	}
	sizes := make([]int64, len(ds))
	for i, d := range ds {
		sizes[i] = -1
		n, err := e.Size(ctx, d)
		if err == nil {
			err = e.Delete(ctx, d)
		}
		switch {
		case errors.Is(err, ErrMissing):
		case err != nil:
			return nil, err
		default:
			sizes[i] = n
		}
	}
	return sizes, nil
}
