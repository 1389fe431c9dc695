package fusefs

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// Changes made through other mounts (fleet hosts sharing one PostgreSQL
// registry) reach this one through the registry's change feed
// (namespaces.Watcher): one goroutine takes each change and drops what the
// kernel and the nodes cache about it. An unlink drops the blob's entry
// in its namespace (an hour of entry timeout otherwise), a removed or
// re-created namespace its directory entry, a chmod or chown the
// directory's and incoming/'s attributes and the nsDir's cached Perm. A
// Resync (the feed connected, reconnected or fell behind: changes may
// have been missed) drops every namespace directory's entry, and with it
// every entry the kernel holds below it.
//
// That goroutine is the only place the feed's notifications are sent
// from: never a FUSE request, and no request ever waits for it, because
// the kernel takes the directory's lock to invalidate an entry and a
// request holding it may be waiting on the daemon (see "Caching" in the
// package doc). It holds no node lock when it notifies, and it asks the
// kernel only about entries the node tree shows it holds, so changes the
// kernel never saw cost no system call. NotifyEntry, not NotifyDelete:
// the latter would also zero the link count of the blob's inode, which is
// one per digest and still linked in other namespaces.
//
// The feed leaves out this mount's own changes, and new references: an
// absent name is never cached, so a lookup finds a new blob at once.

// watch is a mount's consumer of its registry's change feed.
type watch struct {
	cancel context.CancelFunc
	done   chan struct{}
	log    *slog.Logger
}

// watchStopWait bounds how long an unmount waits for the consumer: one
// stuck in a notification (the kernel waiting for a directory lock) must
// not keep the daemon from exiting.
const watchStopWait = 5 * time.Second

// startWatch starts consuming the registry's changes, if it has a feed;
// nil if it has none (SQLite: every process is on this host, and the
// kernel's one-second timeouts of directories and attributes apply).
func (f *FS) startWatch() *watch {
	wr, ok := f.reg.(namespaces.Watcher)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithCancel(f.ctx)
	ch, err := wr.Watch(ctx)
	if err != nil {
		cancel()
		if !errors.Is(err, namespaces.ErrNoFeed) {
			f.log.Warn("no change feed from the namespace registry: changes made on other hosts show once the kernel's caches expire (blobs: an hour)", "err", err)
		}
		return nil
	}
	w := &watch{cancel: cancel, done: make(chan struct{}), log: f.log}
	go func() {
		defer close(w.done)
		for c := range ch {
			f.applyChange(c)
		}
	}()
	return w
}

// stop ends the consumer and waits for it, at most watchStopWait.
func (w *watch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(watchStopWait):
		w.log.Warn("the namespace change consumer did not stop; leaving it", "waited", watchStopWait)
	}
}

// applyChange drops what the mount caches about c. It runs on the watch
// goroutine only.
func (f *FS) applyChange(c namespaces.Change) {
	root := &f.root.Inode
	switch c.Kind {
	case namespaces.Unlinked:
		d := f.knownNS(c.Namespace)
		if d == nil || !d.inited.Load() {
			return
		}
		name := c.Digest.String()
		if d.GetChild(name) != nil {
			notifyEntry(&d.Inode, name)
		}
	case namespaces.Removed, namespaces.Created:
		if d := f.knownNS(c.Namespace); d != nil {
			d.forgetPerm()
		}
		if root.GetChild(c.Namespace) != nil {
			notifyEntry(root, c.Namespace)
		}
	case namespaces.PermChanged:
		d := f.knownNS(c.Namespace)
		if d == nil {
			return
		}
		d.forgetPerm()
		if d.inited.Load() {
			// Attributes only (offset -1): a directory has no content the
			// kernel caches here. No directory lock is taken for this.
			_ = d.NotifyContent(-1, 0)
			_ = d.inc.NotifyContent(-1, 0)
		}
	case namespaces.Resync:
		if c.Err != nil {
			f.log.Warn("namespace change feed reconnected: changes made on other hosts meanwhile may have been missed; dropping what the kernel caches of every namespace", "err", c.Err)
		}
		for _, d := range f.nsDirs() {
			d.forgetPerm()
			if root.GetChild(d.name) != nil {
				notifyEntry(root, d.name)
			}
		}
	}
}

// knownNS is the node state of namespace name, if the mount has any.
func (f *FS) knownNS(name string) *nsDir {
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	return f.ns[name]
}

// forgetPerm makes the next perm read the registry.
func (d *nsDir) forgetPerm() {
	d.permMu.Lock()
	d.permAt = time.Time{}
	d.permMu.Unlock()
}
