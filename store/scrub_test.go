package store_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/store"
)

// TestScrub: a scrub of the whole pool reports each blob once, the
// corrupt one as corrupt with the identity of the file it read, and keeps
// to its byte rate.
func TestScrub(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir) // sqlite+local
	ctx := t.Context()
	var ds []store.Digest
	for _, n := range []int{100, 1 << 20, 2 << 20} {
		d, pin, err := s.Put(ctx, bytes.NewReader(randBytes(n)), int64(n))
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
		ds = append(ds, d)
	}
	flip(t, blobPath(dir, ds[2]), 1_500_000)

	const rate = 2 << 20 // 3 MiB at 2 MiB/s: at least 1.5 s
	var got []store.ScrubResult
	start := time.Now()
	sum, err := s.Scrub(ctx, s.Digests(ctx), store.ScrubOptions{Jobs: 2, Rate: rate, Result: func(r store.ScrubResult) error {
		got = append(got, r)
		return nil
	}})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Checked != 3 || sum.Corrupt != 1 || sum.Unreadable != 0 || sum.Bytes != 100+1<<20 {
		t.Fatalf("summary %+v", sum)
	}
	if took < 1400*time.Millisecond {
		t.Fatalf("3 MiB scrubbed in %s at %d bytes/s", took, rate)
	}
	slices.SortFunc(got, func(a, b store.ScrubResult) int { return int(a.Size - b.Size) })
	for i, r := range got {
		want := store.ScrubOK
		if r.Digest == ds[2] {
			want = store.ScrubCorrupt
		}
		if r.Status != want {
			t.Errorf("blob %d: %s, want %s (%s)", i, r.Status, want, r.Error)
		}
		if isFile := r.Tier == store.TierLarge; (r.File != nil) != isFile {
			t.Errorf("blob %d (%s): file identity %v", i, r.Tier, r.File)
		}
	}

	// Cancelled: the scrub stops and says so.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Scrub(cctx, s.Digests(ctx), store.ScrubOptions{}); err == nil {
		t.Fatal("a cancelled scrub reported no error")
	}
	// Named digests: one the store lacks is missing.
	var absent store.Digest
	absent[0] = 1
	sum, err = s.Scrub(ctx, store.Digests(ds[0], absent), store.ScrubOptions{Explicit: true})
	if err != nil || sum.Missing != 1 || sum.Checked != 1 {
		t.Fatalf("explicit scrub: %+v, %v", sum, err)
	}
}
