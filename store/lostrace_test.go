package store_test

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"os"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/store"
)

// linkSet is a liveness source (a namespace's links) over a set; err, if
// set, fails every query.
type linkSet struct {
	mu   sync.Mutex
	live map[blob.Digest]bool
	err  error
}

func (l *linkSet) link(d blob.Digest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.live == nil {
		l.live = map[blob.Digest]bool{}
	}
	l.live[d] = true
}

func (l *linkSet) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.live[d], l.err
}

func (l *linkSet) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return func(yield func(blob.Digest, error) bool) {}
}

// TestGetPutBetweenMissAndLink: a Get misses; a put then publishes the
// blob with its link; the Get, finding the link, must look again and
// serve the blob, not call it lost.
func TestGetPutBetweenMissAndLink(t *testing.T) {
	for _, l := range []layout{layouts[2], layouts[1]} {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t, l, t.TempDir())
			links := &linkSet{}
			s.Register(links)
			ctx := t.Context()
			n := 1 << 20
			if !l.large {
				n = 1000
			}
			data := randBytes(n)
			d := blob.Sum(data)
			done := false
			defer store.SetMissHook(func(got store.Digest) {
				if got != d || done {
					return
				}
				done = true
				_, pin, err := s.Put(ctx, bytes.NewReader(data), int64(n))
				if err != nil {
					t.Error(err)
					return
				}
				pin.Release()
				links.link(d)
			})()
			r, ok, err := s.Get(ctx, d)
			if err != nil || !ok {
				t.Fatalf("Get of a blob put after its miss: ok %v, %v; want it served", ok, err)
			}
			r.Close()
			if !done {
				t.Fatal("the hook did not run")
			}
		})
	}
}

// TestLinkedMissNotLost: a linked blob no tier holds is not lost while
// the ledger marks it corrupt (a repair deletes the bad copy before it
// puts the right one), and a failing liveness query answers a plain miss,
// not an error.
func TestLinkedMissNotLost(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, layouts[2], dir)
	links := &linkSet{}
	s.Register(links)
	ctx := t.Context()
	data := randBytes(1 << 20)
	d, pin, err := s.Put(ctx, bytes.NewReader(data), -1)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	links.link(d)
	flip(t, blobPath(dir, d), 1000)
	if sum := scrubAll(t, s); sum.Corrupt != 1 {
		t.Fatalf("scrub: %+v", sum)
	}
	if err := os.Remove(blobPath(dir, d)); err != nil { // as repairing does
		t.Fatal(err)
	}
	if _, ok, err := s.Get(ctx, d); ok || err != nil {
		t.Fatalf("Get of a marked blob in its repair: ok %v, %v; want a miss", ok, err)
	}
	if _, ok, err := s.Stat(ctx, d); ok || err != nil {
		t.Fatalf("Stat of a marked blob in its repair: ok %v, %v; want a miss", ok, err)
	}

	other := randBytes(1000)
	links.mu.Lock()
	links.err = errors.New("liveness query failed")
	links.mu.Unlock()
	if _, ok, err := s.Get(ctx, blob.Sum(other)); ok || err != nil {
		t.Fatalf("Get of an absent blob, the liveness query failing: ok %v, %v; want a miss", ok, err)
	}
	if _, ok, err := s.Stat(ctx, blob.Sum(other)); ok || err != nil {
		t.Fatalf("Stat of an absent blob, the liveness query failing: ok %v, %v; want a miss", ok, err)
	}
}
