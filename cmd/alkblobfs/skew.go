package main

import (
	"fmt"
	"os"
	"time"

	"github.com/alkblobfs/alkblobfs/gc"
)

// clockSkewEnv offsets this process's clock — what is left of the host's
// clock in the process: the store's gc.Clock (sweep reports, the
// in-process delete window) — by a Go duration such as +5m or -5m. It is
// for tests, which start processes whose clocks disagree to check that no
// process's clock decides anything about another's rows (pin expiries, the
// delete window and intents are on the database's clock: meta.Host).
// Hidden: not a flag, not in the man pages; unset, the wall clock.
const clockSkewEnv = "ALKBLOBFS_CLOCK_SKEW"

// processClock is the store's gc.Clock: gc.RealClock, or off it by
// $ALKBLOBFS_CLOCK_SKEW.
func processClock() (gc.Clock, error) {
	v, ok := os.LookupEnv(clockSkewEnv)
	if !ok || v == "" {
		return gc.RealClock, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: want a duration such as +5m or -90s", clockSkewEnv, v)
	}
	return skewedClock(d), nil
}

// skewedClock is the wall clock off by a fixed offset. Its readings keep
// the monotonic clock, so it measures durations as the wall clock does.
type skewedClock time.Duration

func (s skewedClock) Now() time.Time                         { return time.Now().Add(time.Duration(s)) }
func (s skewedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
