package fusefs

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/rundir"
)

// intents adapts the mount to its writer lease (namespaces.Lease): the
// versions of incoming/ files committed at a close and waiting for the
// file's last RELEASE (see publish.go) are pending links held under it.
// The rules (holders, renewal, retries, crash recovery, settling all at
// unmount) are the lease's; the mount only names the writer — "mount:"
// and the mountpoint — and gives it the directory of its pid file for its
// lock, so that the next mount of the same mountpoint finds it.
type intents struct {
	f     *FS
	lease *namespaces.Lease // nil until start, and on a read-only mount

	open atomic.Int64 // intents recorded and not yet settled or canceled
}

func newIntents(f *FS) *intents { return &intents{f: f} }

// start opens the lease, which settles what earlier, dead lives of this
// mountpoint left. A read-only mount records no intents and settles
// nothing.
func (in *intents) start(mountpoint string) {
	if in.f.cfg.ReadOnly {
		return
	}
	// The runtime directory first, at its own mode: the lease would
	// make it, as the leases directory's parent, 0700.
	if err := rundir.Make(rundir.Dir()); err != nil {
		in.f.log.Warn("no runtime directory; should this mount die, the files it closed are published only once their intents lapse", "err", err)
	}
	dir, _ := filepath.Abs(filepath.Join(filepath.Dir(pidFile(mountpoint)), "leases"))
	l, err := namespaces.OpenLease(in.f.ctx, namespaces.LeaseConfig{
		Registry: in.f.reg,
		Name:     "mount:" + mountpoint,
		TTL:      in.f.st.PinTTL(),
		LockDir:  dir,
		Logger:   in.f.log,
	})
	if err != nil {
		// Only a bad config fails: newFS checked the registry, the
		// collector's TTL is positive, the name and directory are set.
		panic(err)
	}
	in.lease = l
}

// pending returns an intent for a publish at a close.
func (in *intents) pending(replaces namespaces.Intent) namespaces.Pending {
	return in.lease.Pending(replaces)
}

func (in *intents) recorded() { in.open.Add(1) }

// settle links i's version now (the file's last RELEASE); a failure is
// retried by the lease.
func (in *intents) settle(ctx context.Context, i namespaces.Intent) (bool, error) {
	in.open.Add(-1)
	return in.lease.Settle(ctx, i)
}

// cancel drops i unseen.
func (in *intents) cancel(ctx context.Context, i namespaces.Intent) error {
	in.open.Add(-1)
	return in.lease.Cancel(ctx, i)
}

// cancelRetries are the pauses between cancelSoon's tries.
var cancelRetries = []time.Duration{200 * time.Millisecond, time.Second, 3 * time.Second}

// cancelSoon is cancel for a process about to close its lease: a
// failure is retried a few times now, not only at the lease's next tick,
// since the lease's close links what it still holds. The intent leaves
// the mount's count at once either way: a failed cancel is the lease's
// to retry (namespaces.Lease.Cancel), at each tick and at its close
// before it links the rest, and no RELEASE of this process settles it.
func (in *intents) cancelSoon(ctx context.Context, i namespaces.Intent) error {
	err := in.cancel(ctx, i)
	for _, wait := range cancelRetries {
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		err = in.lease.Cancel(ctx, i)
	}
	return err
}

// abandon drops i, recorded by a commit that failed: its fate is unknown
// (namespaces.Lease.Abandon). i is 0 when nothing was recorded.
func (in *intents) abandon(i namespaces.Intent) {
	if i != 0 {
		in.lease.Abandon(i)
	}
}

// dropped notes that a commit replaced or dropped i in its own transaction.
func (in *intents) dropped() { in.open.Add(-1) }

// close ends the lease, settling everything still open: files whose close
// returned 0 while a descriptor stayed open until unmount.
func (in *intents) close() {
	if in.lease == nil {
		return
	}
	if err := in.lease.Close(); err != nil {
		in.f.log.Warn("could not settle the intents of files still open at unmount; the next mount of this mountpoint will", "err", err)
	}
}
