package namespaces

import (
	"context"
	"errors"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
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
	// usage is each namespace's usage and quota, kept with every change
	// of its references and intents.
	usage map[string]*memUsage
}

type memIntent struct {
	ns     string
	d      blob.Digest
	holder string
	until  time.Duration // since Mem.base
}

// memUsage is one namespace's usage: every digest it links or pends,
// with its size and how many of its intents name it.
type memUsage struct {
	blobs, bytes int64
	quota        Quota
	size         map[blob.Digest]int64 // every digest linked or pending
	pends        map[blob.Digest]int   // intents naming each pending digest
}

func newMemUsage() *memUsage {
	return &memUsage{size: make(map[blob.Digest]int64), pends: make(map[blob.Digest]int)}
}

// held reports whether the namespace links or pends d.
func (u *memUsage) held(d blob.Digest) bool { _, ok := u.size[d]; return ok }

// charge counts d, new to the namespace, at size.
func (u *memUsage) charge(d blob.Digest, size int64) {
	u.size[d] = size
	u.blobs++
	u.bytes += size
}

// release uncounts d unless the namespace still links (refs) or pends it.
func (u *memUsage) release(refs *ordered, d blob.Digest) {
	size, ok := u.size[d]
	if !ok || u.pends[d] > 0 {
		return
	}
	if _, linked := refs.get(d); linked {
		return
	}
	delete(u.size, d)
	u.blobs--
	u.bytes -= size
}

// admit returns nil if growing by blobs and bytes stays within the quota,
// and an error wrapping blob.ErrQuota otherwise. Growth by nothing is
// always admitted (a dedup).
func (u *memUsage) admit(blobs, bytes int64) error {
	if blobs == 0 || u.quota.Fits(u.blobs+blobs, u.bytes+bytes) {
		return nil
	}
	return meta.QuotaError(u.quota, Usage{Blobs: u.blobs, Bytes: u.bytes}, blobs, bytes)
}

var _ Registry = (*Mem)(nil)

// NewMem returns an empty in-memory registry. clock stamps LinkedAt; nil
// means the wall clock.
func NewMem(clock Clock) *Mem {
	return &Mem{clock: orWall(clock), base: time.Now(), ns: make(map[string]*ordered),
		pending: make(map[Intent]memIntent), pendingIn: make(map[string]int), usage: make(map[string]*memUsage)}
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
	m.usage[name] = newMemUsage()
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
	delete(m.usage, name)
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
	return m.LinkSized(ctx, name, d, 0)
}

// LinkSized implements Registry.
func (m *Mem) LinkSized(ctx context.Context, name string, d blob.Digest, size int64) (bool, error) {
	n, err := m.link(ctx, "link", name, []Sized{{Digest: d, Size: size}})
	return n == 1, err
}

// LinkMany implements Registry.
func (m *Mem) LinkMany(ctx context.Context, name string, ds []blob.Digest) (int, error) {
	sized := make([]Sized, len(ds))
	for i, d := range ds {
		sized[i].Digest = d
	}
	return m.link(ctx, "linkmany", name, sized)
}

// LinkManySized implements Registry.
func (m *Mem) LinkManySized(ctx context.Context, name string, ds []Sized) (int, error) {
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
	if err := checkSize(p.Size); err != nil {
		return 0, wrap("pend", name, d, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.ns[name]; !ok {
		return 0, wrap("pend", name, d, ErrNotFound)
	}
	// The replaced intent goes first, as on SQL, so that its charge is
	// freed before this one's is admitted; a refusal puts it back.
	old, hadOld := m.pending[p.Replaces]
	var oldSize int64
	if hadOld {
		oldSize = m.usage[old.ns].size[old.d]
	}
	m.dropIntentLocked(p.Replaces)
	u := m.usage[name]
	if !u.held(d) {
		if err := u.admit(1, p.Size); err != nil {
			if hadOld {
				m.addIntentLocked(p.Replaces, old, oldSize)
			}
			return 0, wrap("pend", name, d, err)
		}
	}
	i := p.ID
	if i == 0 {
		i = newIntent()
	}
	m.addIntentLocked(i, memIntent{ns: name, d: d, holder: p.Holder, until: time.Since(m.base) + p.TTL}, p.Size)
	return i, nil
}

// addIntentLocked records intent i, charging its namespace size if the
// digest is new to it (the caller has admitted it).
func (m *Mem) addIntentLocked(i Intent, p memIntent, size int64) {
	u := m.usage[p.ns]
	if !u.held(p.d) {
		u.charge(p.d, size)
	}
	u.pends[p.d]++
	m.pending[i] = p
	m.pendingIn[p.ns]++
	m.live.add(p.d, 1)
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
	u := m.usage[p.ns]
	if u.pends[p.d]--; u.pends[p.d] <= 0 {
		delete(u.pends, p.d)
	}
	u.release(m.ns[p.ns], p.d)
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

// link links ds, all or nothing: the digests new to the namespace are
// admitted against its quota together before any is linked.
func (m *Mem) link(ctx context.Context, op, name string, ds []Sized) (int, error) {
	var d0 blob.Digest
	if len(ds) == 1 {
		d0 = ds[0].Digest
	}
	if err := check(ctx, name); err != nil {
		return 0, wrap(op, name, d0, err)
	}
	for _, d := range ds {
		if err := checkSize(d.Size); err != nil {
			return 0, wrap(op, name, d.Digest, err)
		}
	}
	now := m.clock.Now().UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	refs, ok := m.ns[name]
	if !ok {
		return 0, wrap(op, name, d0, ErrNotFound)
	}
	u := m.usage[name]
	var blobs, bytes int64
	seen := make(map[blob.Digest]bool, len(ds))
	for _, d := range ds {
		if !u.held(d.Digest) && !seen[d.Digest] {
			seen[d.Digest] = true
			blobs, bytes = blobs+1, bytes+d.Size
		}
	}
	if err := u.admit(blobs, bytes); err != nil {
		return 0, wrap(op, name, d0, err)
	}
	n := 0
	for _, d := range ds {
		if !u.held(d.Digest) {
			u.charge(d.Digest, d.Size)
		}
		if refs.insert(d.Digest, now) {
			m.live.add(d.Digest, 1)
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
	m.usage[name].release(refs, d)
	return nil
}

// Usage implements Registry.
func (m *Mem) Usage(ctx context.Context, name string) (Usage, error) {
	if err := check(ctx, name); err != nil {
		return Usage{}, wrap("usage", name, blob.Digest{}, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	u, ok := m.usage[name]
	if !ok {
		return Usage{}, wrap("usage", name, blob.Digest{}, ErrNotFound)
	}
	return Usage{Blobs: u.blobs, Bytes: u.bytes, Quota: u.quota}, nil
}

// Unique implements Registry.
func (m *Mem) Unique(ctx context.Context, name string) (UniqueUsage, error) {
	if err := check(ctx, name); err != nil {
		return UniqueUsage{}, wrap("unique usage", name, blob.Digest{}, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	u, ok := m.usage[name]
	if !ok {
		return UniqueUsage{}, wrap("unique usage", name, blob.Digest{}, ErrNotFound)
	}
	var out UniqueUsage
	refs := m.ns[name]
	for d, size := range u.size {
		// live counts every reference and intent naming d; those of
		// this namespace are its own.
		all, _ := m.live.get(d)
		own := int64(u.pends[d])
		if _, linked := refs.get(d); linked {
			own++
		}
		if all == own {
			out.Blobs++
			out.Bytes += size
		}
	}
	return out, nil
}

// SetQuota implements Registry.
func (m *Mem) SetQuota(ctx context.Context, name string, q Quota) error {
	if err := check(ctx, name); err != nil {
		return wrap("set quota", name, blob.Digest{}, err)
	}
	if err := q.Check(); err != nil {
		return wrap("set quota", name, blob.Digest{}, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	u, ok := m.usage[name]
	if !ok {
		return wrap("set quota", name, blob.Digest{}, ErrNotFound)
	}
	u.quota = q
	return nil
}

// Recount implements Registry: the counters are recomputed from the
// sizes of the digests each namespace holds.
func (m *Mem) Recount(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, wrap("recount", "", blob.Digest{}, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	fixed := 0
	for _, u := range m.usage {
		var bytes int64
		for _, size := range u.size {
			bytes += size
		}
		if blobs := int64(len(u.size)); blobs != u.blobs || bytes != u.bytes {
			u.blobs, u.bytes = blobs, bytes
			fixed++
		}
	}
	return fixed, nil
}

// damageUsage sets a namespace's counters to wrong values, for the tests
// of Recount.
func (m *Mem) damageUsage(name string, blobs, bytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if u, ok := m.usage[name]; ok {
		u.blobs, u.bytes = blobs, bytes
	}
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
