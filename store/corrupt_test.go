package store_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/store"
)

// scrubAll scrubs s whole and returns the summary.
func scrubAll(t *testing.T, s *store.Store) store.ScrubSummary {
	t.Helper()
	sum, err := s.Scrub(t.Context(), s.Digests(t.Context()), store.ScrubOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// wantRefused checks that Get refuses d as known corrupt, up front.
func wantRefused(t *testing.T, s *store.Store, d store.Digest, who string) {
	t.Helper()
	r, ok, err := s.Get(t.Context(), d)
	if err == nil {
		r.Close()
		t.Fatalf("%s: Get of a blob a scrub found corrupt succeeded (ok %v)", who, ok)
	}
	if !errors.Is(err, store.ErrCorrupt) || !errors.Is(err, store.ErrVerification) {
		t.Fatalf("%s: Get: %v; want ErrCorrupt and ErrVerification", who, err)
	}
	if msg := err.Error(); !bytes.Contains([]byte(msg), []byte(d.String())) || bytes.Contains([]byte(msg), []byte(os.TempDir())) {
		t.Fatalf("%s: the refusal %q should name the digest and no path", who, msg)
	}
}

// TestCorruptVerdictShared: a scrub in one process (a store) finds a
// flipped byte; every store over the same database refuses the blob at Get
// from then on, before any byte. Putting the right content again repairs
// it: the copy is replaced and every store serves it.
func TestCorruptVerdictShared(t *testing.T) {
	for _, l := range []layout{layouts[2], layouts[1]} { // sqlite+local (a large blob), kv-only-sqlite
		t.Run(l.name, func(t *testing.T) {
			dir := t.TempDir()
			a, b := openStore(t, l, dir), openStore(t, l, dir)
			ctx := t.Context()
			n := 1 << 20
			if !l.large {
				n = 1000
			}
			data := randBytes(n)
			d, pin, err := a.Put(ctx, bytes.NewReader(data), int64(n))
			if err != nil {
				t.Fatal(err)
			}
			pin.Release()
			if l.large {
				flip(t, blobPath(dir, d), int64(n/2))
			} else {
				if err := sqlite.FlipValueBit(ctx, a.KV().(engines.SQL).DB(), d); err != nil {
					t.Fatal(err)
				}
			}
			if sum := scrubAll(t, a); sum.Corrupt != 1 {
				t.Fatalf("scrub: %+v; want one corrupt blob", sum)
			}
			wantRefused(t, a, d, "the scrubbing store")
			wantRefused(t, b, d, "another store over the same database")
			if cs, err := b.Corrupt(ctx); err != nil || len(cs) != 1 || cs[0].Digest != d {
				t.Fatalf("Corrupt() = %v, %v; want the one blob", cs, err)
			}

			// The repair: the right content, put again through the other
			// store, replaces the bad copy.
			d2, pin, err := b.Put(ctx, bytes.NewReader(data), int64(n))
			if err != nil || d2 != d {
				t.Fatalf("put again: %s, %v", d2, err)
			}
			pin.Release()
			for _, s := range []*store.Store{a, b} {
				if got := readAll(t, s, d); !bytes.Equal(got, data) {
					t.Fatal("the repaired blob reads wrong")
				}
			}
			if cs, err := a.Corrupt(ctx); err != nil || len(cs) != 0 {
				t.Fatalf("after the repair Corrupt() = %v, %v; want none", cs, err)
			}
			if sum := scrubAll(t, b); sum.Corrupt != 0 || sum.Checked != 1 {
				t.Fatalf("scrub after the repair: %+v", sum)
			}
		})
	}
}

// TestCorruptThenRestored: a corrupt blob whose file changes (a restore)
// is suspect: served, but only verified — no passthrough, no Trust — and a
// reader that verifies every byte ends the corrupt record for every store.
// A chmod alone changes the file too, and the bytes stay refused when read.
func TestCorruptThenRestored(t *testing.T) {
	dir := t.TempDir()
	a, b := openStore(t, layouts[2], dir), openStore(t, layouts[2], dir)
	ctx := t.Context()
	data := randBytes(1 << 20)
	d, pin, err := a.Put(ctx, bytes.NewReader(data), -1)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	// Known good as the file is: passthrough allowed.
	if got := readAll(t, a, d); !bytes.Equal(got, data) {
		t.Fatal("read")
	}
	r, _, err := a.Get(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Passthrough(); !ok {
		t.Fatal("a blob verified whole as its file is now may not pass through")
	}
	r.Close()

	const at = 700_000
	path := blobPath(dir, d)
	flip(t, path, at)
	if sum := scrubAll(t, b); sum.Corrupt != 1 {
		t.Fatalf("scrub: %+v", sum)
	}
	wantRefused(t, a, d, "after the scrub")

	// Restored through the filesystem: a new ctime, so suspect.
	flip(t, path, at)
	r, ok, err := a.Get(ctx, d)
	if err != nil || !ok {
		t.Fatalf("Get of a restored blob: %v, %v", ok, err)
	}
	defer r.Close()
	if !r.Changed() {
		t.Fatal("a restored corrupt blob is not reported changed")
	}
	r.Trust()
	if r.Trusted() {
		t.Fatal("a suspect blob was trusted")
	}
	if _, ok := r.Passthrough(); ok {
		t.Fatal("a suspect blob may pass through")
	}
	buf := make([]byte, len(data))
	if n, err := r.ReadAt(buf, 0); n != len(data) || err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("verified read of the restored blob: %d, %v", n, err)
	}
	if cs, err := b.Corrupt(ctx); err != nil || len(cs) != 0 {
		t.Fatalf("after a whole verified read Corrupt() = %v, %v; want none", cs, err)
	}
	if got := readAll(t, b, d); !bytes.Equal(got, data) {
		t.Fatal("the restored blob reads wrong in the other store")
	}
}
