package fusefs

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// intents keeps the mount's pending links (namespaces.Intent): the
// versions of incoming/ files committed at a close and waiting for the
// file's last RELEASE (see publish.go). They are durable rows where the
// registry is SQL, held under a name stable across restarts of this mount
// (host and mountpoint), so that:
//
//   - the next mount of the same mountpoint settles what a crashed one
//     left (every close that returned 0 is published);
//   - while this mount lives, a loop renews them, and any other process
//     settles them only once they lapse (a host that never comes back);
//   - a settle or cancel that fails is retried by the loop;
//   - at unmount, every intent still open is settled: its close returned 0.
type intents struct {
	f      *FS
	holder string
	ttl    time.Duration

	open atomic.Int64 // intents recorded and not yet settled or canceled

	mu         sync.Mutex
	unfinished map[namespaces.Intent]bool // settle (true) or cancel (false) to retry
	recovered  bool                       // our holder's leftovers were settled

	stop, done chan struct{}
}

func newIntents(f *FS) *intents {
	ttl := f.st.GC().PinTTL()
	return &intents{f: f, ttl: ttl, unfinished: make(map[namespaces.Intent]bool)}
}

// holderFor names a mount's intents: host and mountpoint.
func holderFor(mountpoint string) string {
	host, _ := os.Hostname()
	return "mount:" + host + ":" + mountpoint
}

// start settles what an earlier life of this mountpoint left, and starts
// the renewal loop. A read-only mount records no intents and settles
// nothing.
func (in *intents) start(mountpoint string) {
	in.holder = holderFor(mountpoint)
	if in.f.cfg.ReadOnly {
		return
	}
	in.recover(in.f.ctx)
	in.stop, in.done = make(chan struct{}), make(chan struct{})
	go in.loop()
}

func (in *intents) recover(ctx context.Context) {
	n, err := in.f.reg.Recover(ctx, in.holder)
	if err != nil {
		in.f.log.Warn("could not settle the files an earlier mount closed before it died; retrying", "holder", in.holder, "err", err)
		return
	}
	in.mu.Lock()
	in.recovered = true
	in.mu.Unlock()
	if n > 0 {
		in.f.log.Info("published files whose close succeeded before an earlier mount stopped", "files", n)
	}
}

// pending returns an intent for a publish at a close.
func (in *intents) pending(replaces namespaces.Intent) namespaces.Pending {
	return namespaces.Pending{Holder: in.holder, Until: time.Now().Add(in.ttl), Replaces: replaces}
}

func (in *intents) recorded() { in.open.Add(1) }

// settle links i's version now (the file's last RELEASE).
func (in *intents) settle(ctx context.Context, i namespaces.Intent) (bool, error) {
	in.open.Add(-1)
	linked, err := in.f.reg.Settle(ctx, i)
	if err != nil {
		in.retry(i, true)
	}
	return linked, err
}

// cancel drops i unseen.
func (in *intents) cancel(ctx context.Context, i namespaces.Intent) error {
	in.open.Add(-1)
	err := in.f.reg.Cancel(ctx, i)
	if err != nil {
		in.retry(i, false)
	}
	return err
}

// dropped notes that a commit replaced or dropped i in its own transaction.
func (in *intents) dropped() { in.open.Add(-1) }

func (in *intents) retry(i namespaces.Intent, settle bool) {
	in.mu.Lock()
	in.unfinished[i] = settle
	in.mu.Unlock()
}

func (in *intents) loop() {
	defer close(in.done)
	t := time.NewTicker(max(in.ttl/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-in.stop:
			return
		case <-t.C:
		}
		in.tick(in.f.ctx)
	}
}

// tick renews, retries, and settles other holders' lapsed intents.
func (in *intents) tick(ctx context.Context) {
	f := in.f
	in.mu.Lock()
	recovered := in.recovered
	work := make(map[namespaces.Intent]bool, len(in.unfinished))
	for i, s := range in.unfinished {
		work[i] = s
	}
	in.mu.Unlock()
	if !recovered {
		in.recover(ctx)
	}
	if in.open.Load() > 0 || len(work) > 0 {
		if err := f.reg.Renew(ctx, in.holder, time.Now().Add(in.ttl)); err != nil {
			f.log.Warn("could not renew the intents of files being written; they lapse after the pin TTL", "err", err)
		}
	}
	for i, settle := range work {
		var err error
		if settle {
			_, err = f.reg.Settle(ctx, i)
		} else {
			err = f.reg.Cancel(ctx, i)
		}
		if err == nil {
			in.mu.Lock()
			delete(in.unfinished, i)
			in.mu.Unlock()
		}
	}
	if _, err := f.reg.Recover(ctx, ""); err != nil {
		f.log.Debug("could not settle lapsed intents", "err", err)
	}
}

// close stops the loop and settles everything still open: files whose
// close returned 0 while a descriptor stayed open until unmount.
func (in *intents) close() {
	if in.stop == nil {
		return
	}
	close(in.stop)
	<-in.done
	ctx := context.Background()
	in.tick(ctx)
	if _, err := in.f.reg.Recover(ctx, in.holder); err != nil {
		in.f.log.Warn("could not settle the intents of files still open at unmount; the next mount of this mountpoint will", "err", err)
	}
}
