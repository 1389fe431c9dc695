package gc_test

import (
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
)

// TestStress drives puts, pins, links, unlinks and sweeps concurrently and
// checks both invariants at the moment of every delete: the deleted digest
// holds no pin the test knows of and no source reports it live. Afterwards,
// with every pin released, sweeps must collect exactly the unreferenced.
func TestStress(t *testing.T) {
	rounds := 1000
	if os.Getenv("ALKBLOBFS_LONG") != "" {
		rounds = 50_000
	}
	for _, durable := range []bool{false, true} {
		for _, batch := range []bool{false, true} {
			name := "inline"
			if durable {
				name = "durable"
			}
			if batch {
				name += "-batch"
			}
			t.Run(name, func(t *testing.T) { stress(t, durable, batch, rounds) })
		}
	}
}

func stress(t *testing.T, durable, batch bool, rounds int) {
	const keys, workers = 64, 6
	src := gctest.NewSource()
	opts := gc.Options{}
	if durable {
		opts.Window = gc.NewMemWindow(nil)
	}
	p := gctest.NewPool(opts)
	if batch {
		p = gctest.NewBatchPool(opts).Pool
	}
	c := p.C
	c.Register(src)

	// held counts pins the test holds: incremented after Pin returns,
	// decremented before Release, so it never over-states protection.
	var held [keys]atomic.Int32
	idx := make(map[blob.Digest]int, keys)
	for i := range keys {
		idx[dg(i)] = i
	}
	var violations atomic.Int32
	p.OnDelete = func(d blob.Digest) {
		if held[idx[d]].Load() > 0 {
			t.Errorf("deleted %s while pinned", d.Short())
			violations.Add(1)
		}
		if live, _ := src.IsLive(context.Background(), d); live {
			t.Errorf("deleted %s while live in a source", d.Short())
			violations.Add(1)
		}
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []*gc.Pin
			for range rounds {
				i := rng.IntN(keys)
				d := dg(i)
				switch rng.IntN(5) {
				case 0: // put: pin before publish, keep the pin a while
					pin, _ := c.Pin(context.Background(), d)
					held[i].Add(1)
					p.Add(d)
					mine = append(mine, pin)
				case 1: // release an older pin
					if len(mine) > 0 {
						k := rng.IntN(len(mine))
						held[idx[mine[k].Digest()]].Add(-1)
						mine[k].Release()
						mine = append(mine[:k], mine[k+1:]...)
					}
				case 2: // link, as the namespaces service does: pin, check, link, release
					pin, _ := c.Pin(context.Background(), d)
					held[i].Add(1)
					if p.Holds(d) {
						src.Set(d, true)
					}
					held[i].Add(-1)
					pin.Release()
				case 3:
					src.Set(d, false)
				case 4:
					_ = c.Delete(context.Background(), d)
				}
			}
			for _, pin := range mine {
				held[idx[pin.Digest()]].Add(-1)
				pin.Release()
			}
		}()
	}
	done := make(chan struct{})
	var sweeps atomic.Int32
	go func() {
		defer close(done)
		for {
			if _, err := c.Sweep(context.Background()); err != nil {
				t.Errorf("sweep: %v", err)
				return
			}
			if sweeps.Add(1) >= 20 && allDone(&wg) {
				return
			}
		}
	}()
	wg.Wait()
	<-done
	if violations.Load() > 0 {
		t.Fatalf("%d invariant violations", violations.Load())
	}
	// Quiesced: every pin released. Everything unreferenced goes within
	// two sweeps (one for the inline window).
	for range 2 {
		mustSweep(t, c)
	}
	for _, d := range p.Digests() {
		if live, _ := src.IsLive(t.Context(), d); !live {
			t.Errorf("%s unreferenced and unpinned, but survived", d.Short())
		}
	}
	for _, d := range src.Digests() {
		if !p.Holds(d) {
			t.Errorf("%s referenced but deleted", d.Short())
		}
	}
	t.Logf("%d sweeps, %d entries left, all referenced", sweeps.Load(), p.Len())
}

// allDone reports whether wg has reached zero, without blocking.
func allDone(wg *sync.WaitGroup) bool {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
