package namespaces

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Pool is what a Service needs of the blob pool. *store.Store satisfies it.
type Pool interface {
	// Has reports whether d is in the pool.
	Has(ctx context.Context, d blob.Digest) (bool, error)
	// Pin protects d from deletion, in every process that shares the
	// pool, until the pin is released.
	Pin(ctx context.Context, d blob.Digest) (*gc.Pin, error)
	// PinMany is Pin for many digests at once.
	PinMany(ctx context.Context, ds []blob.Digest) ([]*gc.Pin, error)
	// Size returns d's logical size, which a link charges to the
	// namespace's usage; an error wrapping blob.ErrMissing if the pool
	// does not hold d.
	Size(ctx context.Context, d blob.Digest) (int64, error)
}

// Service is a Registry whose Link and LinkMany refuse digests that are not
// in the pool, so that a namespace never names bytes it cannot serve. Every
// other method is the Registry's. The mount and the CLI link through a
// Service; a bare Registry is for wiring and tests.
type Service struct {
	Registry
	pool Pool
}

var _ Registry = (*Service)(nil)

// NewService returns a Service linking into r after checking p.
func NewService(r Registry, p Pool) *Service { return &Service{Registry: r, pool: p} }

// ManyHaver is an optional Pool capability: Has for many digests at once.
type ManyHaver interface {
	HasMany(ctx context.Context, ds []blob.Digest) ([]bool, error)
}

// Have is what the have surfaces (the CLI's, HTTP's) answer: present[i]
// if the namespace links ds[i] and the pool holds it; lost[i] if the
// namespace links it and the pool does not (its content was lost behind
// the store's back). A lost blob is not present, so a client puts it
// again, which repairs it.
func (s *Service) Have(ctx context.Context, name string, ds []blob.Digest) (present, lost []bool, err error) {
	present, err = s.Registry.HasMany(ctx, name, ds)
	if err != nil {
		return nil, nil, err
	}
	var idx []int
	var linked []blob.Digest
	for i, p := range present {
		if p {
			idx, linked = append(idx, i), append(linked, ds[i])
		}
	}
	lost = make([]bool, len(ds))
	if len(linked) == 0 {
		return present, lost, nil
	}
	held := make([]bool, len(linked))
	if mh, ok := s.pool.(ManyHaver); ok {
		if held, err = mh.HasMany(ctx, linked); err != nil {
			return nil, nil, err
		}
	} else {
		for j, d := range linked {
			if held[j], err = s.pool.Has(ctx, d); err != nil {
				return nil, nil, err
			}
		}
	}
	for j, i := range idx {
		if !held[j] {
			present[i], lost[i] = false, true
		}
	}
	return present, lost, nil
}

// Link links d into the namespace if d is in the pool; otherwise it returns
// an error wrapping blob.ErrMissing and changes nothing.
//
// It pins d before checking, and releases the pin once the reference is
// committed: a sweep that deletes d between the check and the link would
// leave a reference to nothing, and the pin makes that sweep's arbitration
// keep d instead. Where pins are rows, the pin commits before the check, so
// this holds for a sweep in any process. After the link, the registry
// itself keeps d live.
//
// It charges the blob's size, which it asks the pool, to the namespace's
// usage (Registry.LinkSized): a link over the namespace's quota fails
// with blob.ErrQuota.
func (s *Service) Link(ctx context.Context, name string, d blob.Digest) (bool, error) {
	var linked bool
	err := s.checked(ctx, "link", name, d, func(size int64) (err error) {
		linked, err = s.Registry.LinkSized(ctx, name, d, size)
		return err
	})
	return linked, err
}

// LinkSized is Link; size is ignored for the pool's own (the caller's
// figure could be wrong, and usage must be exact).
func (s *Service) LinkSized(ctx context.Context, name string, d blob.Digest, _ int64) (bool, error) {
	return s.Link(ctx, name, d)
}

// Pend is Registry.Pend with Link's pool check; the intent is charged the
// pool's size of d, whatever p.Size says.
func (s *Service) Pend(ctx context.Context, name string, d blob.Digest, p Pending) (Intent, error) {
	var i Intent
	err := s.checked(ctx, "pend", name, d, func(size int64) (err error) {
		p.Size = size
		i, err = s.Registry.Pend(ctx, name, d, p)
		return err
	})
	return i, err
}

// checked runs f with d's size while d is pinned and known to be in the
// pool.
func (s *Service) checked(ctx context.Context, op, name string, d blob.Digest, f func(size int64) error) error {
	if err := check(ctx, name); err != nil {
		return wrap(op, name, d, err)
	}
	pin, err := s.pool.Pin(ctx, d)
	if err != nil {
		return wrap(op, name, d, err)
	}
	defer pin.Release()
	if err := s.present(ctx, d); err != nil {
		return wrap(op, name, d, err)
	}
	size, err := s.pool.Size(ctx, d)
	if err != nil {
		return wrap(op, name, d, err)
	}
	return f(size)
}

// LinkMany is Link for many digests, all or nothing: one missing digest
// fails the call and links none, and so does a quota the new ones would
// exceed (Registry.LinkManySized).
func (s *Service) LinkMany(ctx context.Context, name string, ds []blob.Digest) (int, error) {
	if err := check(ctx, name); err != nil {
		return 0, wrap("linkmany", name, blob.Digest{}, err)
	}
	pins, err := s.pool.PinMany(ctx, ds)
	if err != nil {
		return 0, wrap("linkmany", name, blob.Digest{}, err)
	}
	defer gc.ReleaseAll(pins)
	sized := make([]Sized, len(ds))
	for i, d := range ds {
		if err := s.present(ctx, d); err != nil {
			return 0, wrap("linkmany", name, d, err)
		}
		size, err := s.pool.Size(ctx, d)
		if err != nil {
			return 0, wrap("linkmany", name, d, err)
		}
		sized[i] = Sized{Digest: d, Size: size}
	}
	return s.Registry.LinkManySized(ctx, name, sized)
}

// LinkManySized is LinkMany; the sizes are the pool's, not the caller's.
func (s *Service) LinkManySized(ctx context.Context, name string, ds []Sized) (int, error) {
	digests := make([]blob.Digest, len(ds))
	for i, d := range ds {
		digests[i] = d.Digest
	}
	return s.LinkMany(ctx, name, digests)
}

func (s *Service) present(ctx context.Context, d blob.Digest) error {
	ok, err := s.pool.Has(ctx, d)
	if err == nil && !ok {
		err = blob.ErrMissing
	}
	return err
}

// LinkRows is the namespace part of a put that links its digest into
// name (store.WithLink): the reference, charged the put's content length
// (meta.NSRows.For) against the namespace's usage and quota, judged in the
// transaction that writes it. A link over the quota fails the put with
// blob.ErrQuota, and where the registry's rows are in the kv engine's
// database (Joinable) the put's entry then does not commit either.
func (s *Service) LinkRows(name string) (meta.NSRows, error) {
	if err := ValidName(name); err != nil {
		return meta.NSRows{}, wrap("link", name, blob.Digest{}, err)
	}
	return s.join(meta.NSRows{Link: &meta.LinkRow{NS: name}}), nil
}

// SettleRows is LinkRows for a writer's final version: it links the
// digest and drops the intent p.Replaces (the writer's earlier version)
// atomically. The earlier version goes first, so that its charge is
// freed before this one's is admitted against the quota: a file
// rewritten near the limit is judged by what it will hold, not by both
// versions at once.
func (s *Service) SettleRows(name string, p Pending) (meta.NSRows, error) {
	if p.Replaces == 0 {
		return s.LinkRows(name)
	}
	if err := checkPend(context.Background(), name, p); err != nil {
		return meta.NSRows{}, wrap("pend", name, blob.Digest{}, err)
	}
	return s.join(meta.NSRows{Intent: p.intentRow(name), Replaces: int64(p.Replaces), Settle: true}), nil
}

// PendRows is LinkRows for an intent (Registry.Pend): the put records p,
// charged the put's content length (p.Size is ignored) as a link is. It
// returns the intent, whose id it chooses now (p.ID, if set): a caller
// whose put failed drops it (Lease.Abandon), as the put's commit may have
// landed with its answer lost — unless the put was refused over the
// quota (blob.ErrQuota) or for its namespace (ErrNotFound): those come
// from the transaction that would have recorded the intent, which then
// rolled back, so there is nothing to drop.
func (s *Service) PendRows(name string, p Pending) (meta.NSRows, Intent, error) {
	if err := checkPend(context.Background(), name, p); err != nil {
		return meta.NSRows{}, 0, wrap("pend", name, blob.Digest{}, err)
	}
	if p.ID == 0 {
		p.ID = newIntent()
	}
	return s.join(meta.NSRows{Intent: p.intentRow(name), Replaces: int64(p.Replaces)}), p.ID, nil
}

// intentRow is p as a put's namespace part records it in namespace name.
func (p Pending) intentRow(name string) *meta.IntentRow {
	return &meta.IntentRow{ID: int64(p.ID), NS: name, Holder: p.Holder, TTL: p.TTL}
}

// join binds r to the registry's rows where they are in the kv engine's
// database.
func (s *Service) join(r meta.NSRows) meta.NSRows {
	if j, ok := s.Registry.(Joinable); ok {
		return j.Join(r)
	}
	return r
}

// CommitRows writes a put's namespace part r after the put published its
// entry, where the two cannot commit together (an engine that cannot
// join them, a large put): a link runs with Link's pool check; an intent
// with Pend's; a settle records an intent replacing r.Replaces and then
// settles it, two steps each atomic, so that a crash between them leaves
// only the final version pending. The put's pin protects the entry
// meanwhile. A part that is none of meta.NSRows's shapes fails with
// meta.ErrNSRowsMixed, writing nothing.
func (s *Service) CommitRows(ctx context.Context, r meta.NSRows) error {
	if err := r.Check(); err != nil {
		return err
	}
	if k := r.Link; k != nil {
		_, err := s.Link(ctx, k.NS, k.D)
		return err
	}
	i := r.Intent
	if i == nil {
		return nil
	}
	p := Pending{Holder: i.Holder, TTL: i.TTL, Replaces: Intent(r.Replaces)}
	if !r.Settle {
		p.ID = Intent(i.ID)
	}
	id, err := s.Pend(ctx, i.NS, i.D, p)
	if err != nil || !r.Settle {
		return err
	}
	_, err = s.Settle(ctx, id)
	return err
}

// unsizedRows is a registry whose rows may lack sizes: a store made
// before usage was kept (SQL).
type unsizedRows interface {
	unsizedPage(ctx context.Context, after blob.Digest, n int) ([]blob.Digest, error)
	setSize(ctx context.Context, d blob.Digest, size int64) error
}

// FillSizes gives the references and intents made before usage was kept
// their blobs' sizes, from the pool, and then recounts every namespace's
// usage (Registry.Recount); it returns how many digests it sized. A
// digest the pool does not hold (lost) is sized 0. Until it runs, such
// rows count as blobs of 0 bytes. It finds nothing to do at once on a
// store made since (an index holds only the unsized references), so
// every process that opens a writable store may call it.
func (s *Service) FillSizes(ctx context.Context) (int, error) {
	u, ok := s.Registry.(unsizedRows)
	if !ok {
		return 0, nil
	}
	filled := 0
	var after blob.Digest
	for {
		page, err := u.unsizedPage(ctx, after, pageSize)
		if err != nil {
			return filled, wrap("fill sizes", "", blob.Digest{}, err)
		}
		if len(page) == 0 {
			break
		}
		for _, d := range page {
			size, err := s.pool.Size(ctx, d)
			if errors.Is(err, blob.ErrMissing) {
				size, err = 0, nil
			}
			if err == nil {
				err = u.setSize(ctx, d, size)
			}
			if err != nil {
				return filled, wrap("fill sizes", "", d, err)
			}
			filled++
		}
		after = page[len(page)-1]
	}
	if filled == 0 {
		return 0, nil
	}
	_, err := s.Registry.Recount(ctx)
	return filled, err
}

// SettleLapsed links the versions every lapsed intent stands for (Recover
// with no holder): those of a writer that died and whose lease has lapsed
// (Pending.TTL after its last renewal), whichever process notices. Every
// process that opens a writable store with namespaces calls it at open
// (the CLI's commands, serve), and a long-lived one keeps calling it
// (KeepSettling), as a mount's lease does: so a dead mount's files whose
// close or fsync returned publish without another mount of its
// mountpoint.
func (s *Service) SettleLapsed(ctx context.Context) (int, error) {
	return s.Registry.Recover(ctx, "")
}

// KeepSettling runs SettleLapsed every third of ttl (the intents' TTL, the
// store's pin TTL) until stop, which waits for a call in progress.
// Failures are logged at debug and retried at the next tick.
func (s *Service) KeepSettling(ttl time.Duration, lg *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(ttl/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if n, err := s.SettleLapsed(ctx); err != nil && ctx.Err() == nil {
				lg.Debug("could not settle lapsed intents", "err", err)
			} else if n > 0 {
				lg.Info("published files whose close succeeded before their writer died", "files", n)
			}
		}
	}()
	return sync.OnceFunc(func() { cancel(); <-done })
}
