package namespaces

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/gc"
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

// LinkFunc returns a publish hook that links the put's digest into name,
// shaped as store.LinkFunc so that store.WithLink(svc.LinkFunc(ns)) needs no
// conversion (this package does not import store). size is the put's
// content length, which the link charges to the namespace (LinkSized): a
// link over the quota fails the put, and in the joint form nothing
// commits.
//
// With tx set, the put is inserting d in that very transaction, so the
// registry links in it (TxLinker) and skips the pool check: the reference
// commits exactly when the entry does, and the put's own pin protects d
// until then. A registry that cannot join a transaction fails the put
// rather than link outside it. With tx nil (engines that cannot join), the
// entry is already published and Link runs with its pool check.
func (s *Service) LinkFunc(name string) func(ctx context.Context, tx *sql.Tx, d blob.Digest, size int64) error {
	return func(ctx context.Context, tx *sql.Tx, d blob.Digest, size int64) error {
		if tx == nil {
			_, err := s.Link(ctx, name, d)
			return err
		}
		tl, err := s.txLinker(name, d)
		if err != nil {
			return err
		}
		_, err = tl.LinkTx(ctx, tx, name, d, size)
		return err
	}
}

// SettleFunc is LinkFunc for a writer's final version: it links d and drops
// the intent p.Replaces (the writer's earlier version) atomically. Inside
// the put's transaction that is one link and one delete; without one it
// records an intent replacing p.Replaces and settles it, two steps each
// atomic, so a crash between them leaves only the final version pending.
func (s *Service) SettleFunc(name string, p Pending) func(ctx context.Context, tx *sql.Tx, d blob.Digest, size int64) error {
	if p.Replaces == 0 {
		return s.LinkFunc(name)
	}
	return func(ctx context.Context, tx *sql.Tx, d blob.Digest, size int64) error {
		if tx == nil {
			i, err := s.Pend(ctx, name, d, p)
			if err != nil {
				return err
			}
			_, err = s.Settle(ctx, i)
			return err
		}
		tl, err := s.txLinker(name, d)
		if err != nil {
			return err
		}
		// The earlier version goes first, as in Pend, so that its
		// charge is freed before this one's is admitted against the
		// quota: a file rewritten near the limit is judged by what it
		// will hold, not by both versions at once.
		if err := tl.CancelTx(ctx, tx, p.Replaces); err != nil {
			return err
		}
		_, err = tl.LinkTx(ctx, tx, name, d, size)
		return err
	}
}

// PendFunc is LinkFunc for an intent (Registry.Pend): the publish records
// p, and *out receives the intent once it is written — also when the put
// then fails, as its transaction's COMMIT may have landed unanswered (or,
// with tx nil, the intent's own: SQL.Pend). A caller whose put failed with
// *out set drops it (Lease.Abandon).
//
// The intent is charged size, the put's content length (p.Size is
// ignored): one over the namespace's quota fails the put with
// blob.ErrQuota, and in the joint form the put's entry does not commit.
func (s *Service) PendFunc(name string, p Pending, out *Intent) func(ctx context.Context, tx *sql.Tx, d blob.Digest, size int64) error {
	return func(ctx context.Context, tx *sql.Tx, d blob.Digest, size int64) error {
		p.Size = size
		var i Intent
		var err error
		if tx == nil {
			i, err = s.Pend(ctx, name, d, p)
		} else {
			var tl TxLinker
			if tl, err = s.txLinker(name, d); err == nil {
				i, err = tl.PendTx(ctx, tx, name, d, p)
			}
		}
		if i != 0 {
			*out = i
		}
		return err
	}
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

func (s *Service) txLinker(name string, d blob.Digest) (TxLinker, error) {
	if tl, ok := s.Registry.(TxLinker); ok {
		return tl, nil
	}
	return nil, wrap("link", name, d, errors.New("registry cannot link inside a database transaction (open it with namespaces.Open on the kv engine)"))
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
