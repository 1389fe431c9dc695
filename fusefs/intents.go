package fusefs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// intents keeps the mount's pending links (namespaces.Intent): the
// versions of incoming/ files committed at a close and waiting for the
// file's last RELEASE (see publish.go). They are durable rows where the
// registry is SQL, held under a name that tells the host, the mountpoint
// and the daemon's pid (see newHolder), so that:
//
//   - the next mount of the same mountpoint settles what a crashed one
//     left, once its pid is gone (every close that returned 0 is
//     published);
//   - while this mount lives, a loop renews them, and any other process
//     settles them only once they lapse (a host that never comes back);
//   - a settle or cancel that fails is retried by the loop;
//   - at unmount, every intent still open is settled: its close returned 0.
type intents struct {
	f      *FS
	prefix string // this mountpoint's holders
	holder string // this life's
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

// holderPrefix names the mounts of one mountpoint on one host; a holder
// adds the daemon's pid and a random generation, so that every life of a
// mount holds its own intents: two daemons of one mountpoint (a lazily
// detached one still serving open files, and its successor) never settle
// each other's live intents.
func holderPrefix(mountpoint string) string {
	host, _ := os.Hostname()
	return "mount:" + host + ":" + mountpoint + ":"
}

func newHolder(mountpoint string) string {
	var b [8]byte
	rand.Read(b[:])
	return holderPrefix(mountpoint) + strconv.Itoa(os.Getpid()) + ":" + hex.EncodeToString(b[:])
}

// start settles what earlier, dead lives of this mountpoint left, and
// starts the renewal loop. A read-only mount records no intents and
// settles nothing.
func (in *intents) start(mountpoint string) {
	in.prefix = holderPrefix(mountpoint)
	in.holder = newHolder(mountpoint)
	if in.f.cfg.ReadOnly {
		return
	}
	in.recover(in.f.ctx)
	in.stop, in.done = make(chan struct{}), make(chan struct{})
	go in.loop()
}

// recover settles the intents of earlier lives of this mountpoint whose
// daemon is gone (its pid no longer runs). A daemon still running (a
// lazily detached mount serving open files) keeps its own; if it never
// settles them, they lapse and any process settles them.
func (in *intents) recover(ctx context.Context) {
	holders, err := in.f.reg.Holders(ctx)
	if err != nil {
		in.f.log.Warn("could not look for files an earlier mount closed before it died; retrying", "err", err)
		return
	}
	total := 0
	for _, h := range holders {
		if h == in.holder || !strings.HasPrefix(h, in.prefix) || alive(strings.TrimPrefix(h, in.prefix)) {
			continue
		}
		n, err := in.f.reg.Recover(ctx, h)
		if err != nil {
			in.f.log.Warn("could not settle the files an earlier mount closed before it died; retrying", "holder", h, "err", err)
			return
		}
		total += n
	}
	in.mu.Lock()
	in.recovered = true
	in.mu.Unlock()
	if total > 0 {
		in.f.log.Info("published files whose close succeeded before an earlier mount stopped", "files", total)
	}
}

// alive reports whether the pid at the start of "PID:GENERATION" runs.
func alive(rest string) bool {
	pid, err := strconv.Atoi(strings.SplitN(rest, ":", 2)[0])
	if err != nil || pid <= 0 {
		return false
	}
	if pid == os.Getpid() {
		return true // an earlier life in this process (a test's remount)
	}
	return syscall.Kill(pid, 0) != syscall.ESRCH
}

// pending returns an intent for a publish at a close.
func (in *intents) pending(replaces namespaces.Intent) namespaces.Pending {
	return namespaces.Pending{Holder: in.holder, TTL: in.ttl, Replaces: replaces}
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
	if err := f.reg.Renew(ctx, in.holder, in.ttl); err != nil {
		f.log.Warn("could not renew the intents of files being written; they lapse after the pin TTL", "err", err)
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
