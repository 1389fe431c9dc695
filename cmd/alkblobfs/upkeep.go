package main

import (
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/alkblobfs/alkblobfs/upkeep"
)

// upkeepFlags are the sweep and scrub schedules of a command that keeps a
// store open (mount, serve): the same flags, the same validation, one
// upkeep.Config.
type upkeepFlags struct {
	sweepEvery time.Duration
	scrubEvery time.Duration
	scrubRate  float64 // MB/s
}

// register adds --sweep-every, --scrub-every and --scrub-rate; sweepNote
// ends --sweep-every's help (where else the timer can be changed).
func (u *upkeepFlags) register(f *pflag.FlagSet, sweepNote string) {
	f.Var((*everyValue)(&u.sweepEvery), "sweep-every", "sweep on a timer, e.g. 1h (0: off"+sweepNote+")")
	f.Var((*everyValue)(&u.scrubEvery), "scrub-every", "re-verify every blob from disk on a timer, e.g. 24h (0: off)")
	f.Float64Var(&u.scrubRate, "scrub-rate", upkeep.DefaultScrubRate/1e6, "most MB a scrub reads per second (0: unlimited)")
}

// check validates the flags before anything is opened (readOnly: the
// store is served read-only, which does not sweep) and returns the
// scrub rate in bytes per second.
func (u *upkeepFlags) check(cmd *cobra.Command, readOnly bool) (rate int64, err error) {
	if err := upkeep.CheckSweepEvery(u.sweepEvery, readOnly); err != nil {
		return 0, usagef(cmd, "--sweep-every: %v", err)
	}
	if u.scrubRate < 0 {
		return 0, usagef(cmd, "--scrub-rate %g: want 0 (unlimited) or a positive number of MB/s", u.scrubRate)
	}
	rate = int64(u.scrubRate * 1e6)
	if err := upkeep.CheckScrub(u.scrubEvery, rate); err != nil {
		return 0, usagef(cmd, "--scrub-every: %v", err)
	}
	return rate, nil
}

// everyValue is a timer flag in upkeep's grammar (upkeep.ParseEvery), the
// one the control files and HTTP take: pflag's own duration would take
// "+5m" and "5m5m", which they refuse.
type everyValue time.Duration

func (v *everyValue) String() string { return time.Duration(*v).String() }
func (v *everyValue) Type() string   { return "duration" }
func (v *everyValue) Set(s string) error {
	d, err := upkeep.ParseEvery(s)
	if err != nil {
		return err
	}
	*v = everyValue(d)
	return nil
}
