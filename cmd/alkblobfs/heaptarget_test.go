package main

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestGoGCPercentFor(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for _, tc := range []struct {
		live, target uint64
		want         int
	}{
		{0, 64 * mib, 100},
		{10 * mib, 64 * mib, 100},
		{32 * mib, 64 * mib, 100},     // twice the live heap fits
		{40 * mib, 64 * mib, 60},      // the next collection at 64 MiB
		{50 * mib, 64 * mib, 28},      // 50 + 14
		{52 * mib, 64 * mib, 25},      // 52 + 12 would be 23%: the floor
		{64 * mib, 64 * mib, 25},      // at the target
		{1000 * mib, 64 * mib, 25},    // far over it: a quarter, never less
		{1000 * mib, 4096 * mib, 100}, // a large target
		{3000 * mib, 4096 * mib, 36},  // 3000 + 1096
	} {
		if got := goGCPercentFor(tc.live, tc.target); got != tc.want {
			t.Errorf("goGCPercentFor(%d MiB, %d MiB) = %d, want %d", tc.live/mib, tc.target/mib, got, tc.want)
		}
	}
}

// TestPaceHeap paces this process for a target under its live heap: after a
// collection GOGC is the floor, and stop restores 100.
func TestPaceHeap(t *testing.T) {
	// Not parallel: it sets this process's GOGC.
	t.Setenv("GOGC", "") // an operator's GOGC would turn pacing off
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	live := make([][]byte, 0, 64)
	for range cap(live) {
		live = append(live, make([]byte, 256<<10)) // 16 MiB live
	}
	stop := paceHeap(8 << 20)
	gogc := func() int {
		p := debug.SetGCPercent(100)
		debug.SetGCPercent(p)
		return p
	}
	deadline := time.Now().Add(10 * time.Second)
	for gogc() != minGCPercent {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC is %d with 16 MiB live and a target of 8 MiB, want %d", gogc(), minGCPercent)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	stop()
	if p := gogc(); p != 100 {
		t.Errorf("GOGC is %d after stop, want 100", p)
	}
	runtime.KeepAlive(live)
}

// TestPaceHeapLeavesGOGC: a GOGC in the environment, or a target of 0,
// leaves Go's pacing alone (docs/mount.md: --heap-target).
func TestPaceHeapLeavesGOGC(t *testing.T) {
	// Not parallel: it sets this process's GOGC.
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	live := make([][]byte, 0, 64)
	for range cap(live) {
		live = append(live, make([]byte, 256<<10)) // 16 MiB live
	}
	for _, c := range []struct {
		env    string
		target uint64
	}{{"100", 8 << 20}, {"", 0}} {
		t.Setenv("GOGC", c.env)
		debug.SetGCPercent(100)
		stop := paceHeap(c.target)
		for range 5 {
			runtime.GC()
		}
		p := debug.SetGCPercent(100)
		stop()
		if p != 100 {
			t.Errorf("GOGC=%q, target %d: GOGC became %d", c.env, c.target, p)
		}
	}
	runtime.KeepAlive(live)
}
