package namespaces

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
)

// ChangeKind says what a Change did.
type ChangeKind uint8

const (
	// Resync: changes may have been missed (the feed has just connected,
	// or reconnected, or its consumer fell too far behind). Whatever the
	// watcher caches about any namespace may be stale.
	Resync ChangeKind = iota + 1
	// Unlinked: Namespace no longer references Digest.
	Unlinked
	// Created: Namespace was created.
	Created
	// Removed: Namespace was removed.
	Removed
	// PermChanged: Namespace's Perm changed (chmod, chown).
	PermChanged
)

func (k ChangeKind) String() string {
	switch k {
	case Resync:
		return "resync"
	case Unlinked:
		return "unlinked"
	case Created:
		return "created"
	case Removed:
		return "removed"
	case PermChanged:
		return "perm"
	}
	return "unknown"
}

// Change is one committed change to a registry, as Watch reports it.
type Change struct {
	Kind      ChangeKind
	Namespace string      // "" for Resync
	Digest    blob.Digest // Unlinked only
	// Err, on a Resync, is why changes may have been missed: the error
	// that ended the feed's last connection (nil at the first).
	Err error
}

// ErrNoFeed is Watch's error for a registry that reports no changes:
// SQLite's, whose writers share one host and no notification channel.
var ErrNoFeed = errors.New("no change feed")

// Watcher is a Registry that reports the changes other processes commit
// to the registry it shares with them (the database of a fleet), so that
// a mount can drop what its kernel caches about them.
//
// Only changes that make a cached view wrong are reported: an unlink, a
// namespace created or removed, a Perm changed. A new reference is not:
// a mount never caches an absent name, so the next lookup finds it, and
// on PostgreSQL a notification per put would queue every put's commit
// behind the server's one notification lock.
type Watcher interface {
	// Watch delivers, until ctx ends, the changes that other registries
	// over the same state commit, each once it has committed, in commit
	// order; this registry's own changes are left out. Delivery is best
	// effort and says when it failed: a Resync comes first, again after
	// every reconnection (changes committed meanwhile were missed), and in
	// place of changes dropped because the consumer fell behind by over
	// feedMax. The feed never waits for its consumer; the channel closes
	// once ctx ends.
	Watch(ctx context.Context) (<-chan Change, error)
}

// feedMax is how many changes a feed holds for a consumer that has not
// taken them: beyond it, they are dropped for one Resync (a consumer that
// far behind does better invalidating everything than each name).
const feedMax = 4096

var errBehind = fmt.Errorf("the consumer fell behind by over %d changes", feedMax)

// feed is the queue between a source of changes, which must never wait
// (a database connection whose notifications back up on the server, a
// writer's call), and the channel its consumer reads.
type feed struct {
	mu     sync.Mutex
	q      []Change
	resync *Change // a Resync owed ahead of q
	wake   chan struct{}
	out    chan Change
}

// newFeed starts a feed that forwards until ctx ends, then closes its
// channel.
func newFeed(ctx context.Context) *feed {
	f := &feed{wake: make(chan struct{}, 1), out: make(chan Change)}
	go f.run(ctx)
	return f
}

// push queues c without waiting. A Resync, or an overflow, replaces
// everything queued: it covers it.
func (f *feed) push(c Change) {
	f.mu.Lock()
	switch {
	case c.Kind == Resync:
		f.q, f.resync = nil, &c
	case len(f.q) >= feedMax:
		f.q, f.resync = nil, &Change{Kind: Resync, Err: errBehind}
	default:
		f.q = append(f.q, c)
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// next takes the oldest change queued.
func (f *feed) next() (Change, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.resync; r != nil {
		f.resync = nil
		return *r, true
	}
	if len(f.q) == 0 {
		return Change{}, false
	}
	c := f.q[0]
	f.q = f.q[1:]
	if len(f.q) == 0 {
		f.q = nil // let the backing array go
	}
	return c, true
}

func (f *feed) run(ctx context.Context) {
	defer close(f.out)
	for {
		c, ok := f.next()
		if !ok {
			select {
			case <-f.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		select {
		case f.out <- c:
		case <-ctx.Done():
			return
		}
	}
}

// Bus links registries of one process that stand for different processes
// over the same state, as the hosts of a fleet share a database: each
// registry Join returns reports its changes to the Watch of the others.
// It is the feed of tests and of in-process fleets; a SQL registry on
// PostgreSQL has its own (LISTEN/NOTIFY).
type Bus struct {
	mu    sync.Mutex
	feeds map[*Joined][]*feed
}

// NewBus returns an empty bus.
func NewBus() *Bus { return &Bus{feeds: make(map[*Joined][]*feed)} }

// Join returns r as a member of the bus: a Registry and a Watcher whose
// changes reach the other members' watchers once each call has returned.
func (b *Bus) Join(r Registry) *Joined { return &Joined{Registry: r, bus: b} }

func (b *Bus) publish(from *Joined, c Change) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for j, fs := range b.feeds {
		if j == from {
			continue
		}
		for _, f := range fs {
			f.push(c)
		}
	}
}

// Joined is a registry on a Bus.
type Joined struct {
	Registry
	bus *Bus
}

var _ Watcher = (*Joined)(nil)

// Watch implements Watcher.
func (j *Joined) Watch(ctx context.Context) (<-chan Change, error) {
	f := newFeed(ctx)
	f.push(Change{Kind: Resync})
	b := j.bus
	b.mu.Lock()
	b.feeds[j] = append(b.feeds[j], f)
	b.mu.Unlock()
	context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		fs := b.feeds[j]
		for i, g := range fs {
			if g == f {
				b.feeds[j] = append(fs[:i:i], fs[i+1:]...)
				break
			}
		}
		if len(b.feeds[j]) == 0 {
			delete(b.feeds, j)
		}
	})
	return f.out, nil
}

func (j *Joined) Create(ctx context.Context, name string) error {
	return j.then(j.Registry.Create(ctx, name), Change{Kind: Created, Namespace: name})
}

func (j *Joined) CreatePerm(ctx context.Context, name string, p Perm) error {
	return j.then(j.Registry.CreatePerm(ctx, name, p), Change{Kind: Created, Namespace: name})
}

func (j *Joined) SetPerm(ctx context.Context, name string, p Perm) error {
	return j.then(j.Registry.SetPerm(ctx, name, p), Change{Kind: PermChanged, Namespace: name})
}

func (j *Joined) Remove(ctx context.Context, name string) error {
	return j.then(j.Registry.Remove(ctx, name), Change{Kind: Removed, Namespace: name})
}

func (j *Joined) Unlink(ctx context.Context, name string, d blob.Digest) error {
	return j.then(j.Registry.Unlink(ctx, name, d), Change{Kind: Unlinked, Namespace: name, Digest: d})
}

// then publishes c if err, the change's outcome, is nil.
func (j *Joined) then(err error, c Change) error {
	if err == nil {
		j.bus.publish(j, c)
	}
	return err
}
