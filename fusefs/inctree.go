package fusefs

import (
	"context"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// incTree is the state one namespace's incoming/ tree shares: which files
// have an upload in flight (rmdir of the namespace waits for none, unmount
// discards them) and which owe a RELEASE that lookups wait for.
type incTree struct {
	ns *nsDir

	mu     sync.Mutex
	live   map[*fileNode]struct{} // files with an upload in flight
	closed bool
	// owed holds the files whose version is committed but linked only at
	// the RELEASE the kernel sends after the last close (see publish.go),
	// with the digest and when it was committed; changed is closed and
	// replaced whenever one is paid.
	owed    map[*fileNode]owedRelease
	changed chan struct{}
}

type owedRelease struct {
	d     blob.Digest
	since time.Time
	// releasing: the RELEASE arrived at this time and its link is being
	// committed.
	releasing time.Time
}

// releaseWait bounds how long a lookup or listing of the namespace waits
// for the RELEASE owed since a close: long enough for the kernel to
// deliver the RELEASE that follows a last close (microseconds; tens of
// milliseconds on a loaded machine, where 50 ms lost TestCloseThenStat
// its file once in a run of make test beside other builds), short enough that a descriptor kept open
// elsewhere (a forked child closed its copy; a shell still runs
// `cmd > f`) costs a lookup little. A close older than that is not waited
// for at all. Once the RELEASE has arrived, its link is waited for up to
// settleWait: it commits in the database, where it may queue behind a
// sweep for far longer than 50 ms (a stress test lost files that way).
const (
	releaseWait = 200 * time.Millisecond
	settleWait  = 10 * time.Second
)

func newIncTree(ns *nsDir) *incTree {
	return &incTree{ns: ns, live: make(map[*fileNode]struct{}), owed: make(map[*fileNode]owedRelease), changed: make(chan struct{})}
}

func (t *incTree) owe(n *fileNode, d blob.Digest) {
	t.mu.Lock()
	t.owed[n] = owedRelease{d: d, since: time.Now()}
	t.mu.Unlock()
}

// releasing marks n's owed RELEASE as arrived: its link is committing.
func (t *incTree) releasing(n *fileNode) {
	t.mu.Lock()
	if o, ok := t.owed[n]; ok {
		o.releasing = time.Now()
		t.owed[n] = o
	}
	t.mu.Unlock()
}

func (t *incTree) paid(n *fileNode) {
	t.mu.Lock()
	if _, ok := t.owed[n]; ok {
		delete(t.owed, n)
		close(t.changed)
		t.changed = make(chan struct{})
	}
	t.mu.Unlock()
}

// awaitRelease waits until no RELEASE of a recent close is owed for
// digest *d (any digest when d is nil), at most releaseWait after that
// close: so that `cp f incoming/ && stat ns/<digest>` finds the file.
// Closes after the call began are not waited for, so the wait is bounded
// however busy the writers are.
func (t *incTree) awaitRelease(ctx context.Context, d *blob.Digest) {
	start := time.Now()
	for {
		t.mu.Lock()
		now := time.Now()
		var until time.Time
		for _, o := range t.owed {
			if (d != nil && o.d != *d) || o.since.After(start) {
				continue
			}
			end := o.since.Add(releaseWait)
			if !o.releasing.IsZero() {
				end = o.releasing.Add(settleWait)
			}
			if end.After(now) && end.After(until) {
				until = end
			}
		}
		ch := t.changed
		t.mu.Unlock()
		if until.IsZero() {
			return
		}
		timer := time.NewTimer(until.Sub(now))
		select {
		case <-ch:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return
		}
		timer.Stop()
	}
}

func (t *incTree) addLive(n *fileNode) {
	t.mu.Lock()
	t.live[n] = struct{}{}
	t.mu.Unlock()
}

func (t *incTree) dropLive(n *fileNode) {
	t.mu.Lock()
	delete(t.live, n)
	t.mu.Unlock()
}

func (t *incTree) busy() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live) > 0
}

func (t *incTree) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// close discards every upload in flight and stops receipts from expiring
// into a tree that is going away.
func (t *incTree) close() {
	t.mu.Lock()
	t.closed = true
	live := make([]*fileNode, 0, len(t.live))
	for n := range t.live {
		live = append(live, n)
	}
	t.mu.Unlock()
	for _, n := range live {
		n.discard()
	}
}
