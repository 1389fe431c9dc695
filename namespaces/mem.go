package namespaces

import (
	"context"
	"errors"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Mem is an in-memory Registry, for stores whose kv engine is not
// SQL-backed. Its state dies with the process. The zero value is not
// usable; call NewMem.
type Mem struct {
	clock Clock
	// base is what intents are timed from: time.Since(base) reads the
	// process's monotonic clock, which no setting of the wall clock moves
	// (the Clock stamps links only).
	base time.Time

	mu    sync.RWMutex
	ns    map[string]*ordered // namespace → digest → linked_at (unix ns)
	names []string            // the keys of ns, sorted
	live  ordered             // digest → number of references and intents naming it
	// pending holds the intents (Pend); pendingIn counts them per namespace.
	pending   map[Intent]memIntent
	pendingIn map[string]int
	perms     map[string]Perm // recorded Perms (CreatePerm, SetPerm)
}

type memIntent struct {
	ns     string
	d      blob.Digest
	holder string
	until  time.Duration // since Mem.base
}

var _ Registry = (*Mem)(nil)

// NewMem returns an empty in-memory registry. clock stamps LinkedAt; nil
// means the wall clock.
func NewMem(clock Clock) *Mem {
	return &Mem{clock: orWall(clock), base: time.Now(), ns: make(map[string]*ordered),
		pending: make(map[Intent]memIntent), pendingIn: make(map[string]int)}
}

// Create implements Registry.
func (m *Mem) Create(ctx context.Context, name string) error { return m.create(ctx, name, nil) }

// CreatePerm implements Registry.
func (m *Mem) CreatePerm(ctx context.Context, name string, p Perm) error {
	return m.create(ctx, name, &p)
}

func (m *Mem) create(ctx context.Context, name string, p *Perm) error {
	if err := check(ctx, name); err != nil {
		return wrap("create", name, blob.Digest{}, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.ns[name]; ok {
		return wrap("create", name, blob.Digest{}, ErrExists)
	}
	m.ns[name] = &ordered{}
	i, _ := slices.BinarySearch(m.names, name)
	m.names = slices.Insert(m.names, i, name)
	if p != nil {
		if m.perms == nil {
			m.perms = make(map[string]Perm)
		}
		m.perms[name] = p.clean()
	}
	return nil
}

// Perm implements Registry.
func (m *Mem) Perm(ctx context.Context, name string) (Perm, bool, error) {
	if err := check(ctx, name); err != nil {
		return Perm{}, false, wrap("perm", name, blob.Digest{}, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if _, ok := m.ns[name]; !ok {
		return Perm{}, false, wrap("perm", name, blob.Digest{}, ErrNotFound)
	}
	p, ok := m.perms[name]
	return p, ok, nil
}

// SetPerm implements Registry.
func (m *Mem) SetPerm(ctx context.Context, name string, p Perm) error {
	if err := check(ctx, name); err != nil {
		return wrap("set perm", name, blob.Digest{}, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.ns[name]; !ok {
		return wrap("set perm", name, blob.Digest{}, ErrNotFound)
	}
	if m.perms == nil {
		m.perms = make(map[string]Perm)
	}
	m.perms[name] = p.clean()
	return nil
}

// Remove implements Registry.
func (m *Mem) Remove(ctx context.Context, name string) error {
	if err := check(ctx, name); err != nil {
		return wrap("remove", name, blob.Digest{}, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	refs, ok := m.ns[name]
	switch {
	case !ok:
		return wrap("remove", name, blob.Digest{}, ErrNotFound)
	case refs.len() > 0 || m.pendingIn[name] > 0:
		return wrap("remove", name, blob.Digest{}, ErrNotEmpty)
	}
	delete(m.ns, name)
	delete(m.perms, name)
	i, _ := slices.BinarySearch(m.names, name)
	m.names = slices.Delete(m.names, i, i+1)
	return nil
}

// Exists implements Registry.
func (m *Mem) Exists(ctx context.Context, name string) (bool, error) {
	if err := check(ctx, name); err != nil {
		return false, wrap("exists", name, blob.Digest{}, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.ns[name]
	return ok, nil
}

// Names implements Registry.
func (m *Mem) Names(ctx context.Context, after string) iter.Seq2[string, error] {
	return paged(ctx, "names", "", func(first bool, last string) ([]string, error) {
		from := after
		if !first {
			from = last
		}
		m.mu.RLock()
		defer m.mu.RUnlock()
		i, found := slices.BinarySearch(m.names, from)
		if found {
			i++
		}
		return slices.Clone(m.names[i:min(len(m.names), i+pageSize)]), nil
	})
}

// Link implements Registry.
func (m *Mem) Link(ctx context.Context, name string, d blob.Digest) (bool, error) {
	n, err := m.link(ctx, "link", name, []blob.Digest{d})
	return n == 1, err
}

// LinkMany implements Registry.
func (m *Mem) LinkMany(ctx context.Context, name string, ds []blob.Digest) (int, error) {
	return m.link(ctx, "linkmany", name, ds)
}

// Pend implements Registry.
func (m *Mem) Pend(ctx context.Context, name string, d blob.Digest, p Pending) (Intent, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("pend", name, d, err)
	}
	if p.Holder == "" {
		return 0, wrap("pend", name, d, errors.New("an intent needs a holder"))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.ns[name]; !ok {
		return 0, wrap("pend", name, d, ErrNotFound)
	}
	m.dropIntentLocked(p.Replaces)
	i := newIntent()
	m.pending[i] = memIntent{ns: name, d: d, holder: p.Holder, until: time.Since(m.base) + p.TTL}
	m.pendingIn[name]++
	m.live.add(d, 1)
	return i, nil
}

// Settle implements Registry.
func (m *Mem) Settle(ctx context.Context, i Intent) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, wrap("settle", "", blob.Digest{}, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settleLocked(i), nil
}

func (m *Mem) settleLocked(i Intent) bool {
	p, ok := m.pending[i]
	if !ok {
		return false
	}
	added := m.ns[p.ns].insert(p.d, m.clock.Now().UnixNano())
	if added {
		m.live.add(p.d, 1)
	}
	m.dropIntentLocked(i)
	return added
}

func (m *Mem) dropIntentLocked(i Intent) {
	p, ok := m.pending[i]
	if !ok {
		return
	}
	delete(m.pending, i)
	if m.pendingIn[p.ns]--; m.pendingIn[p.ns] == 0 {
		delete(m.pendingIn, p.ns)
	}
	m.live.add(p.d, -1)
}

// Cancel implements Registry.
func (m *Mem) Cancel(ctx context.Context, i Intent) error {
	if err := ctx.Err(); err != nil {
		return wrap("cancel", "", blob.Digest{}, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropIntentLocked(i)
	return nil
}

// Renew implements Registry.
func (m *Mem) Renew(ctx context.Context, holder string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return wrap("renew", "", blob.Digest{}, err)
	}
	until := time.Since(m.base) + ttl
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, p := range m.pending {
		if p.holder == holder {
			p.until = until
			m.pending[i] = p
		}
	}
	return nil
}

// Holders implements Registry.
func (m *Mem) Holders(ctx context.Context) ([]string, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	seen := make(map[string]bool)
	var out []string
	for _, p := range m.pending {
		if !seen[p.holder] {
			seen[p.holder] = true
			out = append(out, p.holder)
		}
	}
	return out, nil
}

// Recover implements Registry.
func (m *Mem) Recover(ctx context.Context, holder string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, wrap("recover", "", blob.Digest{}, err)
	}
	now := time.Since(m.base)
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for i, p := range m.pending {
		if p.holder == holder || p.until < now {
			m.settleLocked(i)
			n++
		}
	}
	return n, nil
}

func (m *Mem) link(ctx context.Context, op, name string, ds []blob.Digest) (int, error) {
	var d0 blob.Digest
	if len(ds) == 1 {
		d0 = ds[0]
	}
	if err := check(ctx, name); err != nil {
		return 0, wrap(op, name, d0, err)
	}
	now := m.clock.Now().UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	refs, ok := m.ns[name]
	if !ok {
		return 0, wrap(op, name, d0, ErrNotFound)
	}
	n := 0
	for _, d := range ds {
		if refs.insert(d, now) {
			m.live.add(d, 1)
			n++
		}
	}
	return n, nil
}

// Unlink implements Registry.
func (m *Mem) Unlink(ctx context.Context, name string, d blob.Digest) error {
	if err := check(ctx, name); err != nil {
		return wrap("unlink", name, d, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	refs, ok := m.ns[name]
	switch {
	case !ok:
		return wrap("unlink", name, d, ErrNotFound)
	case !refs.delete(d):
		return wrap("unlink", name, d, blob.ErrMissing)
	}
	m.live.add(d, -1)
	return nil
}

// Has implements Registry.
func (m *Mem) Has(ctx context.Context, name string, d blob.Digest) (Ref, bool, error) {
	if err := check(ctx, name); err != nil {
		return Ref{}, false, wrap("has", name, d, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	refs, ok := m.ns[name]
	if !ok {
		return Ref{}, false, wrap("has", name, d, ErrNotFound)
	}
	at, ok := refs.get(d)
	if !ok {
		return Ref{}, false, nil
	}
	return Ref{Digest: d, LinkedAt: time.Unix(0, at)}, true, nil
}

// HasMany implements Registry.
func (m *Mem) HasMany(ctx context.Context, name string, ds []blob.Digest) ([]bool, error) {
	if err := check(ctx, name); err != nil {
		return nil, wrap("has", name, blob.Digest{}, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	refs, ok := m.ns[name]
	if !ok {
		return nil, wrap("has", name, blob.Digest{}, ErrNotFound)
	}
	out := make([]bool, len(ds))
	for i, d := range ds {
		_, out[i] = refs.get(d)
	}
	return out, nil
}

// Count implements Registry.
func (m *Mem) Count(ctx context.Context, name string) (int64, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("count", name, blob.Digest{}, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	refs, ok := m.ns[name]
	if !ok {
		return 0, wrap("count", name, blob.Digest{}, ErrNotFound)
	}
	return int64(refs.len()), nil
}

// Entries implements Registry.
func (m *Mem) Entries(ctx context.Context, name string, after blob.Digest) iter.Seq2[Ref, error] {
	if err := ValidName(name); err != nil {
		return fail[Ref](wrap("entries", name, blob.Digest{}, err))
	}
	return paged(ctx, "entries", name, func(first bool, last Ref) ([]Ref, error) {
		m.mu.RLock()
		defer m.mu.RUnlock()
		refs, ok := m.ns[name]
		switch {
		case !ok && first:
			return nil, ErrNotFound
		case !ok: // removed (so emptied) since the last page
			return nil, nil
		}
		var items []item
		if first {
			items = refs.page(after, after.IsZero(), pageSize, make([]item, 0, pageSize))
		} else {
			items = refs.page(last.Digest, false, pageSize, make([]item, 0, pageSize))
		}
		out := make([]Ref, len(items))
		for i, it := range items {
			out[i] = Ref{Digest: it.d, LinkedAt: time.Unix(0, it.v)}
		}
		return out, nil
	})
}

// IsLive implements gc.Source: d is live while any namespace references it
// or any intent means to.
func (m *Mem) IsLive(ctx context.Context, d blob.Digest) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, wrap("islive", "", d, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.live.get(d)
	return ok, nil
}

// Live implements gc.Source: every referenced digest once, ascending.
func (m *Mem) Live(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return paged(ctx, "live", "", func(first bool, last blob.Digest) ([]blob.Digest, error) {
		m.mu.RLock()
		items := m.live.page(last, first, pageSize, make([]item, 0, pageSize))
		m.mu.RUnlock()
		out := make([]blob.Digest, len(items))
		for i, it := range items {
			out[i] = it.d
		}
		return out, nil
	})
}

// check is the preamble of every namespace-specific entry point.
func check(ctx context.Context, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	return ctx.Err()
}
