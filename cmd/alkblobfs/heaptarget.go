package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// The mount daemon's heap is mostly the nodes of the entries the kernel
// keeps looked up, about 490 bytes each: ls -l of a namespace of 100 000
// blobs leaves some 50 MiB live. Go's default pacing (GOGC=100) lets the
// heap grow to twice what is live before it collects, so after such a
// listing half the heap was garbage waiting for a collection and the
// daemon's RSS about 115 MiB. The daemon paces its collector for a heap
// target instead (--heap-target), set again after every collection from
// the live heap it found:
//
//   - while twice the live heap fits in the target, GOGC stays 100: small
//     heaps (reads, writes, small namespaces) are collected as ever;
//   - past that, GOGC drops so that the next collection comes when the
//     heap reaches the target;
//   - but never below minGCPercent: the heap may always grow by a quarter
//     of what is live, so a live heap at or over the target costs at most
//     four times the default's collection work and the collector never
//     runs back to back. A fixed memory limit (GOMEMLIMIT) would, once the
//     live heap neared it: at 80 MiB it kept the RSS at 93 MiB but made a
//     warm ls -l of 100 000 entries take 1.6 s instead of 1.0.
//
// The RSS adds about 25 MiB to the heap: the binary's mapped pages and
// SQLite's page caches. A GOGC in the environment turns the pacing off:
// the operator's setting wins.
const (
	defaultHeapTarget = 64 << 20
	minGCPercent      = 25
)

// goGCPercentFor is the GOGC that sets the next collection at target bytes
// of heap, with live bytes live, within [minGCPercent, 100].
func goGCPercentFor(live, target uint64) int {
	switch {
	case live == 0 || 2*live <= target:
		return 100
	case live >= target:
		return minGCPercent
	}
	return max(minGCPercent, int((target-live)*100/live))
}

// paceHeap paces the collector for a heap of target bytes until the returned
// stop runs, which restores GOGC=100. It does nothing when target is 0 or
// GOGC is set in the environment.
func paceHeap(target uint64) (stop func()) {
	if target == 0 || os.Getenv("GOGC") != "" {
		return func() {}
	}
	p := &heapPacer{target: target, percent: 100, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	p.arm()
	return p.stop
}

// heapPacer sets GOGC after each collection: a finalizer on a sentinel
// object runs once the collection that found it unreachable is done, and
// arms the next.
type heapPacer struct {
	target uint64
	sample []metrics.Sample

	mu      sync.Mutex
	stopped bool
	percent int // the GOGC set last
}

type heapSentinel struct{ p *heapPacer }

func (p *heapPacer) arm() {
	runtime.SetFinalizer(&heapSentinel{p}, func(s *heapSentinel) {
		if s.p.tune() {
			s.p.arm()
		}
	})
}

// tune sets GOGC from the live heap the last collection found, and
// reports whether to go on (false once stopped). It runs on the finalizer
// goroutine, one collection at a time.
func (p *heapPacer) tune() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	metrics.Read(p.sample)
	if p.sample[0].Value.Kind() != metrics.KindUint64 {
		return false // a runtime without the metric: leave Go's pacing alone
	}
	if pct := goGCPercentFor(p.sample[0].Value.Uint64(), p.target); pct != p.percent {
		p.percent = pct
		debug.SetGCPercent(pct)
	}
	return true
}

func (p *heapPacer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		p.stopped = true
		debug.SetGCPercent(100)
	}
}

// heapTargetValue is --heap-target: a size, or 0 for Go's own pacing.
type heapTargetValue int64

func (h *heapTargetValue) String() string { return formatSize(int64(*h)) }
func (h *heapTargetValue) Type() string   { return "size" }
func (h *heapTargetValue) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*h = heapTargetValue(n)
	return nil
}
