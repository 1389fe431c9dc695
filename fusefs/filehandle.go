package fusefs

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/store"
)

// fileHandle is one open of an incoming file.
type fileHandle struct {
	n     *fileNode
	write bool
	idle  bool // flushed, and not written since
	wrote bool // written since its last flush

	rmu sync.Mutex
	rd  *store.Reader // reading a published version
	pin *store.Pin
}

func (n *fileNode) newHandleLocked(flags uint32) *fileHandle {
	// idle: a descriptor that has not written has nothing unflushed.
	h := &fileHandle{n: n, write: flags&syscall.O_ACCMODE != syscall.O_RDONLY, idle: true}
	if h.write {
		if n.writers == nil {
			n.writers = make(map[*fileHandle]struct{})
		}
		n.writers[h] = struct{}{}
	}
	n.handles++
	n.fsys.stats.openHandles.Add(1)
	return h
}

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.prepareWriteLocked(ctx); err != nil {
		return 0, n.fsys.errno("write", n.digestForLog(), err)
	}
	k, err := n.up.WriteAt(data, off)
	if err != nil {
		// ENOSPC and friends: nothing of this file will be published.
		n.failLocked(err)
		return 0, n.fsys.errno("write", n.digestForLog(), err)
	}
	n.dirty, n.written, h.idle, h.wrote = true, true, false, true
	n.meta.mtime = time.Now()
	n.meta.ctime = n.meta.mtime
	n.meta.killPriv()
	n.fsys.stats.writes.Add(1)
	n.fsys.stats.bytesWritten.Add(int64(k))
	return uint32(k), 0
}

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, f := h.n, h.n.fsys
	f.stats.reads.Add(1)
	n.mu.Lock()
	if n.up != nil {
		k, err := n.up.ReadAt(dest, off)
		n.mu.Unlock()
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, f.errno("read", n.digestForLog(), err)
		}
		f.stats.bytesRead.Add(int64(k))
		return fuse.ReadResultData(dest[:k]), 0
	}
	pub, failed := n.pub, n.failed
	n.mu.Unlock()
	if failed != nil {
		return nil, f.errno("read", n.digestForLog(), errPublishFailed)
	}
	if pub == nil || off >= pub.size {
		return fuse.ReadResultData(nil), 0
	}
	rd, err := h.reader(ctx, pub.d)
	if err != nil {
		return nil, f.errno("read", pub.d, err)
	}
	k, err := rd.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		if errors.Is(err, blob.ErrVerification) {
			f.stats.verifyFailures.Add(1)
			f.log.Error("blob fails verification; refusing to serve it", "digest", pub.d.String(), "offset", off, "err", err)
		}
		return nil, f.errno("read", pub.d, err)
	}
	f.stats.bytesRead.Add(int64(k))
	return fuse.ReadResultData(dest[:k]), 0
}

// reader opens (once per published version) a pinned store reader.
func (h *fileHandle) reader(ctx context.Context, d blob.Digest) (*store.Reader, error) {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	if h.rd != nil && h.rd.Digest() == d {
		return h.rd, nil
	}
	h.closeReaderLocked()
	f := h.n.fsys
	pin, err := f.st.Pin(ctx, d)
	if err != nil {
		return nil, err
	}
	r, ok, err := f.st.Get(ctx, d)
	if err == nil && !ok {
		err = blob.Wrap("open", "", d, blob.ErrMissing)
	}
	if err != nil {
		pin.Release()
		return nil, err
	}
	if f.cfg.Verify == VerifyPublish {
		r.Trust()
	}
	f.refs.add(d)
	h.rd, h.pin = r, pin
	return r, nil
}

func (h *fileHandle) closeReaderLocked() {
	if h.rd == nil {
		return
	}
	d := h.rd.Digest()
	h.rd.Close()
	h.pin.Release()
	h.n.fsys.refs.drop(d)
	h.rd, h.pin = nil, nil
}

// Flush is close(2): this is where a publish's error reaches the program.
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno {
	n := h.n
	n.mu.Lock()
	wrote := h.wrote
	if h.write {
		h.idle, h.wrote = true, false
	}
	p := decide(n.stateLocked(), event{kind: evFlush, writer: h.write, wrote: wrote,
		othersBusy: n.othersBusyLocked(h), emptyMismatch: n.want != nil && *n.want != blob.Sum(nil)})
	notes, err := n.carryOutLocked(ctx, p)
	n.mu.Unlock()
	send(notes)
	return n.fsys.errno("close", n.digestForLog(), err)
}

// Fsync commits what was written so far, as a close would, and returns
// once that commit is durable (store.Store.Sync): after a crash or a power
// loss, the next mount publishes it unless a later close superseded it.
// fdatasync is the same: a commit has no metadata to leave out.
func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	n, f := h.n, h.n.fsys
	n.mu.Lock()
	p := decide(n.stateLocked(), event{kind: evFsync})
	notes, err := n.carryOutLocked(ctx, p)
	n.mu.Unlock()
	send(notes)
	if err == nil {
		// Not under n.mu: a sync waits for the disk, and reads of the
		// file need not wait with it.
		err = f.st.Sync(context.WithoutCancel(ctx))
	}
	return f.errno("fsync", n.digestForLog(), err)
}

// carryOutLocked does what a FLUSH or an fsync decided: report the file's
// failure, or commit, and make lookups wait for the RELEASE.
func (n *fileNode) carryOutLocked(ctx context.Context, p step) ([]notice, error) {
	var notes []notice
	var err error
	switch {
	case p.has(stepFail):
		err = n.failed
	case p.has(stepRefuse):
		// The name goes now, not at the RELEASE: nobody may read it back
		// as an empty file meanwhile. A descriptor still open can still
		// complete the put, which then shows under the name as the blob.
		err = blob.Wrap("put", "", *n.want, blob.ErrVerification)
		n.fsys.log.Warn("verified put by path closed empty: the empty content does not hash to the file name",
			"namespace", n.ns.name, "name", n.name)
		n.ns.dropPending(n.name, n)
		notes = []notice{{&n.ns.Inode, n.name}}
	case p.has(stepCommitIntent):
		notes, err = n.commitLocked(ctx, true)
	case p.has(stepCommitLink):
		notes, err = n.commitLocked(ctx, false)
	}
	if p.has(stepOwe) && err == nil {
		d := blob.Sum(nil) // an empty file publishes at its RELEASE
		if n.pub != nil && n.pub.intent != 0 {
			d = n.pub.d
		}
		n.owing = true
		n.tree.owe(n, d)
	}
	return notes, err
}

// othersBusyLocked reports whether a writer handle other than h has
// writes it has not flushed.
func (n *fileNode) othersBusyLocked(h *fileHandle) bool {
	for o := range n.writers {
		if o != h && !o.idle {
			return true
		}
	}
	return false
}

// Release: when the last writer goes, the pending version is linked (or
// what is still uncommitted is committed and linked; its error can only be
// logged), and a file that failed disappears with its last handle.
//
// The link of a pending version (the settle) runs after the file's lock
// is let go: on SQLite it is a lazy job that lingers up to the SQLite Batcher's Linger
// for the next close to share its transaction, and the lstat, chmod,
// utimes and rename that rsync sends right after each close must not
// wait with it (they need none of it). A lookup or listing of the
// namespace, which does need it, hurries it (incTree.awaitRelease).
func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	n, f := h.n, h.n.fsys
	var notes []notice
	n.mu.Lock()
	n.handles--
	f.stats.openHandles.Add(-1)
	if h.write {
		delete(n.writers, h)
		if len(n.writers) == 0 {
			n.writers = nil // a receipt keeps no empty map
		}
	}
	p := decide(n.stateLocked(), event{kind: evRelease, lastWriter: len(n.writers) == 0, lastHandle: n.handles == 0})
	if p.has(stepDiscard) {
		n.discardUploadLocked()
	}
	var hurry *store.Hurry
	if p.has(stepSettle) {
		hurry = new(store.Hurry)
	}
	var ticket uint64 // of the lookups' wait for this RELEASE, paid once it linked
	if p.has(stepPay) {
		n.owing = false
		ticket = n.tree.releasing(n, hurry)
	}
	if p.has(stepCommitLink) {
		notes, _ = n.commitLocked(ctx, false)
	}
	var s settlement
	if p.has(stepSettle) {
		s = n.takeIntentLocked()
	}
	gone := p.has(stepGone)
	if gone {
		n.detachLocked()
	}
	n.mu.Unlock()
	h.rmu.Lock()
	h.closeReaderLocked()
	h.rmu.Unlock()
	if p.has(stepSettle) {
		n.settle(store.WithHurry(ctx, hurry), s)
	}
	if p.has(stepPay) {
		n.tree.paid(ticket)
	}
	send(notes)
	if gone {
		if testHookGone != nil {
			testHookGone()
		}
		if n.want != nil {
			n.ns.dropPending(n.name, n)
			notifyEntry(&n.ns.Inode, n.name)
		} else {
			removeName(&n.Inode)
		}
	}
	return 0
}

// testHookGone, set by tests only, runs between a file's detach at its
// RELEASE and its name's removal: the window a concurrent lookup must not
// find the file in.
var testHookGone func()

func (h *fileHandle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return h.n.fsys.errno("fallocate", blob.Digest{}, errUnsupported)
}
