// Package upkeep runs a store's background work: the sweeps (on a timer,
// and on demand) and the scrubs (re-verifying every blob from the medium at
// a bounded rate). It lives below the surfaces so that every one of them —
// the mount, `alkblobfs serve`, whatever comes next — collects garbage and
// finds bit rot by the same rules: one sweep at a time, one scrub at a time,
// the same timer commands and the same reports. A surface only adapts it:
// the mount's control files and the HTTP routes parse nothing themselves
// (grammar.go: Command, CheckRun, Sweeper.Set, and ParseEvery for the
// flags) and map ErrBadInput and ErrStopped to errnos or statuses; serve
// turns its flags into a Config.
//
// What a scrub finds is kept by the store itself (store.Scrub records a
// corrupt blob where every process that opens the store refuses it), so a
// scrub run here protects every surface alike. Config.OnScrub only lets a
// surface count and log the verdicts its own way.
package upkeep

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/store"
)

var (
	// ErrBadInput: a timer command that is not understood. Nothing
	// changed.
	ErrBadInput = errors.New("invalid input")
	// ErrStopped: a scrub was asked for, or was running, when Stop ran.
	ErrStopped = errors.New("upkeep stopped")
)

// Store is what upkeep needs of a store (*store.Store; a surface may hand
// on a wrapper of its own).
type Store interface {
	Sweep(ctx context.Context) (store.Report, error)
	// LastReport is the last sweep's report in this process.
	LastReport() (store.Report, bool)
	Digests(ctx context.Context) iter.Seq2[blob.Digest, error]
	Scrub(ctx context.Context, seq iter.Seq2[blob.Digest, error], o store.ScrubOptions) (store.ScrubSummary, error)
}

var _ Store = (*store.Store)(nil)

// Config is what New needs: the store and its schedules.
type Config struct {
	Store Store
	// Logger receives a line for every sweep and scrub; nil discards.
	Logger *slog.Logger

	// SweepEvery is the sweep timer (0: off; see CheckSweepEvery).
	SweepEvery time.Duration
	// ReadOnly says the store is served read-only: nothing sweeps it, so
	// SweepEvery must be 0.
	ReadOnly bool

	// ScrubEvery is the scrub timer (0: off) and ScrubRate the most bytes
	// a scrub reads a second (0: unlimited); see CheckScrub.
	ScrubEvery time.Duration
	ScrubRate  int64
	// OnScrub, if set, receives every verdict of every scrub, intact
	// blobs included, before the scrub counts it. It logs the corrupt
	// ones itself, saying what the surface does about them; without it
	// upkeep logs them.
	OnScrub func(store.ScrubResult)
}

// Upkeep is a store's sweeper and scrubber.
type Upkeep struct {
	Sweeper  *Sweeper
	Scrubber *Scrubber
}

// New validates cfg and returns its upkeep, idle until Start.
func New(cfg Config) (*Upkeep, error) {
	if cfg.Store == nil {
		return nil, errors.New("upkeep: Config needs a Store")
	}
	if err := CheckSweepEvery(cfg.SweepEvery, cfg.ReadOnly); err != nil {
		return nil, err
	}
	if err := CheckScrub(cfg.ScrubEvery, cfg.ScrubRate); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Upkeep{
		Sweeper:  newSweeper(cfg.Store, cfg.Logger, cfg.SweepEvery),
		Scrubber: newScrubber(cfg.Store, cfg.Logger, cfg.ScrubEvery, cfg.ScrubRate, cfg.OnScrub),
	}, nil
}

// Start runs the timers that are on.
func (u *Upkeep) Start() {
	u.Sweeper.Start()
	u.Scrubber.Start()
}

// Stop ends the timers, the scrub in progress and a timer's sweep, and
// waits for them: the store can be closed once it returns.
func (u *Upkeep) Stop() {
	u.Sweeper.Stop()
	u.Scrubber.Stop()
}

// Clip shortens a command quoted back in a log line or an error, so that a
// megabyte written to a control file does not land in the log.
func Clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
