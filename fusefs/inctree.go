package fusefs

import (
	"context"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/store"
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
	// with the digest and when it was committed. At that RELEASE the
	// record moves to settling, under a ticket of its own, until the link
	// has committed: the file's lock is not held meanwhile, so a new close
	// of the same file may owe its next version beside it. changed is
	// closed and replaced whenever one is paid, and when a RELEASE starts
	// while someone waits (so that the waiter hurries its settle).
	owed     map[*fileNode]owedRelease
	settling map[uint64]owedRelease
	tickets  uint64
	waiters  int // awaitRelease calls under way
	changed  chan struct{}
}

type owedRelease struct {
	d     blob.Digest
	since time.Time
	// releasing: the RELEASE arrived at this time and its link is being
	// committed; hurry, if set, ends the linger of that commit (a lazy
	// job of SQLite's Batcher, store.Hurry) for a lookup that waits.
	releasing time.Time
	hurry     *store.Hurry
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
	return &incTree{ns: ns, live: make(map[*fileNode]struct{}), owed: make(map[*fileNode]owedRelease),
		settling: make(map[uint64]owedRelease), changed: make(chan struct{})}
}

// owe records that lookups of d wait for n's next RELEASE, replacing what
// n owed before (a version its RELEASE will never link: this one
// superseded it).
func (t *incTree) owe(n *fileNode, d blob.Digest) {
	t.mu.Lock()
	t.owed[n] = owedRelease{d: d, since: time.Now()}
	t.mu.Unlock()
}

// releasing marks n's owed RELEASE as arrived: its link is committing,
// and h (nil when nothing lingers) hurries it. It returns the ticket that
// paid takes, 0 when n owed nothing.
func (t *incTree) releasing(n *fileNode, h *store.Hurry) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.owed[n]
	if !ok {
		return 0
	}
	delete(t.owed, n)
	o.releasing, o.hurry = time.Now(), h
	t.tickets++
	t.settling[t.tickets] = o
	if t.waiters > 0 {
		t.changedLocked()
	}
	return t.tickets
}

// paid ends the wait for the RELEASE of ticket k (releasing's).
func (t *incTree) paid(k uint64) {
	t.mu.Lock()
	if _, ok := t.settling[k]; ok {
		delete(t.settling, k)
		t.changedLocked()
	}
	t.mu.Unlock()
}

func (t *incTree) changedLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// awaitRelease waits until no RELEASE of a recent close is owed for
// digest *d (any digest when d is nil), at most releaseWait after that
// close: so that `cp f incoming/ && stat ns/<digest>` finds the file.
// The links of RELEASEs already arrived are hurried: the request needs
// them now, not after their linger. Closes after the call began are not
// waited for, so the wait is bounded however busy the writers are.
func (t *incTree) awaitRelease(ctx context.Context, d *blob.Digest) {
	start := time.Now()
	t.mu.Lock()
	if len(t.owed) == 0 && len(t.settling) == 0 {
		t.mu.Unlock()
		return
	}
	t.waiters++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.waiters--
		t.mu.Unlock()
	}()
	var hurry []*store.Hurry
	for {
		t.mu.Lock()
		now := time.Now()
		var until time.Time
		wait := func(o owedRelease) {
			if (d != nil && o.d != *d) || o.since.After(start) {
				return
			}
			end := o.since.Add(releaseWait)
			if !o.releasing.IsZero() {
				end = o.releasing.Add(settleWait)
			}
			if end.After(now) && end.After(until) {
				until = end
			}
			if o.hurry != nil && end.After(now) {
				hurry = append(hurry, o.hurry)
			}
		}
		for _, o := range t.owed {
			wait(o)
		}
		for _, o := range t.settling {
			wait(o)
		}
		ch := t.changed
		t.mu.Unlock()
		for _, h := range hurry {
			h.Now()
		}
		hurry = hurry[:0]
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

// awaitSettled waits until no link of a RELEASE is being committed, or
// until; it hurries those it waits for.
func (t *incTree) awaitSettled(until time.Time) {
	for {
		t.mu.Lock()
		if len(t.settling) == 0 || !time.Now().Before(until) {
			t.mu.Unlock()
			return
		}
		var hurry []*store.Hurry
		for _, o := range t.settling {
			if o.hurry != nil {
				hurry = append(hurry, o.hurry)
			}
		}
		ch := t.changed
		t.waiters++
		t.mu.Unlock()
		for _, h := range hurry {
			h.Now()
		}
		timer := time.NewTimer(time.Until(until))
		select {
		case <-ch:
		case <-timer.C:
		}
		timer.Stop()
		t.mu.Lock()
		t.waiters--
		t.mu.Unlock()
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
