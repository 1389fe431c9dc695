//go:build linux

package fusefs

import (
	"strings"
	"testing"
)

// TestWarmListingLeavesOutKnownEntries: a listing gives the kernel the
// attributes of every entry; the next one, within refreshAge, leaves out
// those of the entries the kernel knows, and shows the same; once
// refreshAge has passed, a listing gives them all again.
func TestWarmListingLeavesOutKnownEntries(t *testing.T) {
	const n = 2000
	e := mountStore(t, memSpec)
	e.mkns("w")
	ds := e.fill("w", n)
	d, _ := e.srv.fs.nsDirFor("w")
	leftOut := &e.srv.fs.stats.entriesLeftOut
	// ls -l in a child process (this one serves the mount); incoming/
	// shows the mount's birth time, the same in every listing.
	list := func() string {
		out := run(t, "", "ls", "-l", "--time-style=full-iso", e.path("w"))
		if got := strings.Count(out, "\n"); got != n+2 { // "total" and incoming/
			t.Fatalf("ls -l printed %d lines, want %d", got, n+2)
		}
		return out
	}

	cold := list()
	first := d.refreshedAt.Load()
	if first == 0 || leftOut.Load() != 0 {
		t.Fatalf("after the first listing: refreshed at %d, %d entries left out; want a time and none", first, leftOut.Load())
	}
	if warm := list(); warm != cold {
		t.Fatalf("the second listing differs from the first:\n%s\nwant\n%s", warm, cold)
	}
	// The kernel asks for the first page with attributes, and for later
	// ones without once it gets none for the entries it knows.
	warmLeftOut := leftOut.Load()
	if warmLeftOut == 0 || warmLeftOut > n {
		t.Errorf("the second listing left out %d entries, want some of %d", warmLeftOut, n)
	}
	if got := d.refreshedAt.Load(); got != first {
		t.Errorf("the second listing recorded a refresh (%d, was %d)", got, first)
	}

	// refreshAge later: every entry again.
	d.refreshedAt.Store(first - int64(refreshAge))
	if again := list(); again != cold {
		t.Fatalf("the listing after refreshAge differs from the first:\n%s\nwant\n%s", again, cold)
	}
	if got := leftOut.Load(); got != warmLeftOut {
		t.Errorf("the listing after refreshAge left out %d entries, want none", got-warmLeftOut)
	}
	if got := d.refreshedAt.Load(); got <= first {
		t.Errorf("the listing after refreshAge recorded no refresh (%d, was %d)", got, first)
	}
	// Every entry stats as the listing showed it, from the kernel's cache
	// or through a lookup.
	for _, dg := range ds[:10] {
		if fileSum(t, e.path("w", dg.String())) != dg.String() {
			t.Fatalf("%s: wrong content", dg)
		}
	}
}
