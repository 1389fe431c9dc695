package fusefs

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// version is one committed state of an incoming file.
type version struct {
	d    blob.Digest
	size int64
	// intent, while non-zero: committed at a close, linked into the
	// namespace only at the file's last RELEASE (see publish.go).
	intent namespaces.Intent
}

// fileNode is a file being written (an Upload) or, after publish, its
// receipt. The same type serves a verified put by path (tree nil, want
// set): it lives in the namespace directory until it publishes.
//
// What FLUSH, RELEASE, writes, unlinks and expiry do is decided in
// publish.go; the methods here gather the state and carry the steps out.
type fileNode struct {
	node
	tree *incTree // nil for a put by path
	ns   *nsDir
	want *blob.Digest // put by path: the name, which the content must hash to
	name string       // put by path: the digest name

	mu    sync.Mutex
	meta  meta
	up    *store.Upload // nil when the content is the published version
	dirty bool          // up differs from pub (or pub is nil)
	// owing: this file is in tree.owed (see incTree).
	owing bool
	// written: the content was written (or extended) since the file was
	// created or truncated to nothing (see publish.go).
	written  bool
	pub      *version // last committed version: the receipt
	failed   error    // a write or publish failed: nothing publishes; EIO/ENOSPC
	detached bool     // unlinked, replaced or expired
	writers  map[*fileHandle]struct{}
	handles  int
	seen     time.Time // a receipt's blob was last found in the store
	gen      uint64    // bumped by every publish and detach: stale expiry timers do nothing
	expiry   *time.Timer
	// stale: the kernel's page cache of this file may hold bytes it no
	// longer has (writes of an upload that failed or was dropped), so the
	// next open must not keep it (see Open).
	stale bool
}

var (
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeSetattrer)((*fileNode)(nil))
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeGetxattrer)((*fileNode)(nil))
	_ = (fs.NodeListxattrer)((*fileNode)(nil))
	_ = (fs.NodeSetxattrer)((*fileNode)(nil))
	_ = (fs.NodeRemovexattrer)((*fileNode)(nil))

	_ = (fs.FileReader)((*fileHandle)(nil))
	_ = (fs.FileWriter)((*fileHandle)(nil))
	_ = (fs.FileFlusher)((*fileHandle)(nil))
	_ = (fs.FileReleaser)((*fileHandle)(nil))
	_ = (fs.FileFsyncer)((*fileHandle)(nil))
	_ = (fs.FileAllocater)((*fileHandle)(nil))
)

func newFileNode(f *FS, t *incTree, ns *nsDir, mode, uid, gid uint32) *fileNode {
	return &fileNode{node: node{fsys: f}, tree: t, ns: ns, meta: newMeta(mode, uid, gid)}
}

func (n *fileNode) logName() string {
	if n.want != nil {
		return n.name
	}
	if name, _ := n.Parent(); name != "" {
		return incomingName + "/…/" + name
	}
	return "(unlinked)"
}

func (n *fileNode) getattr(out *fuse.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.getattrLocked(out)
}

func (n *fileNode) getattrLocked(out *fuse.Attr) {
	n.meta.fill(out, syscall.S_IFREG)
	out.Nlink = 1
	var size int64
	switch {
	case n.up != nil:
		size = n.up.Size()
	case n.pub != nil:
		size = n.pub.size
	}
	setSize(out, size)
}

func (n *fileNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.getattr(&out.Attr)
	return 0
}

// stateLocked is the file's state as publish.go's decisions see it.
func (n *fileNode) stateLocked() fileState {
	return fileState{
		uploading: n.up != nil,
		dirty:     n.dirty,
		written:   n.written,
		pending:   n.pub != nil && n.pub.intent != 0,
		owing:     n.owing,
		failed:    n.failed != nil,
		detached:  n.detached,
		byPath:    n.want != nil,
	}
}

// Setattr keeps chmod, chown and utimes in memory (receipts included, so
// cp -a and rsync succeed), and truncates through the upload.
func (n *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	h, _ := fh.(*fileHandle)
	var notes []notice
	var err error
	n.mu.Lock()
	if size, ok := in.GetSize(); ok {
		err = n.truncateLocked(ctx, h, int64(size))
		if err == nil && len(n.writers) == 0 && decide(n.stateLocked(), event{kind: evTruncatePath}).has(stepCommitLink) {
			notes, err = n.commitLocked(ctx, false)
		}
	}
	if err == nil {
		n.meta.set(in, true)
	}
	n.getattrLocked(&out.Attr)
	n.mu.Unlock()
	send(notes)
	return n.fsys.errno("setattr", n.digestForLog(), err)
}

func (n *fileNode) truncateLocked(ctx context.Context, h *fileHandle, size int64) error {
	n.meta.killPriv()
	if n.up == nil && n.failed == nil && n.pub != nil && n.pub.size == size {
		return nil // rsync --inplace and others truncate to the size it has
	}
	if err := n.prepareWriteLocked(ctx); err != nil {
		return err
	}
	if err := n.up.Truncate(size); err != nil {
		n.failLocked(err)
		return err
	}
	n.dirty, n.written = true, size > 0
	n.meta.mtime = time.Now()
	if h != nil {
		h.idle, h.wrote = false, true
	}
	return nil
}

// prepareWriteLocked makes the upload ready for a change: the file's
// failure, or a new upload seeded with the committed content.
func (n *fileNode) prepareWriteLocked(ctx context.Context) error {
	p := decide(n.stateLocked(), event{kind: evWrite})
	switch {
	case p.has(stepFail):
		return n.failed
	case p.has(stepReopen):
		return n.reopenLocked(ctx, true)
	}
	return nil
}

func (n *fileNode) digestForLog() blob.Digest {
	if n.want != nil {
		return *n.want
	}
	return blob.Digest{}
}

// Open of an incoming file for writing makes it an upload again: O_TRUNC
// starts empty, otherwise from the published content (rsync --inplace, dd
// conv=notrunc, >>). Reading serves the upload or the published blob.
func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	trunc := flags&syscall.O_TRUNC != 0
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.detached {
		// The kernel resolved the name to this file before it went: a
		// retry of a refused `cp f incoming/x` whose open raced the
		// failed file's RELEASE. Not ENOENT, which the kernel would
		// return to the caller as it is: ESTALE makes it look the name up
		// again and create the file anew (docs/publish.md).
		return nil, 0, n.fsys.errno("open", n.digestForLog(), errStaleName)
	}
	// The kernel keeps what it cached of the file unless the content
	// changed behind it: every other change is a write or truncate it made
	// itself. Dropping a 1 GiB file's pages (a receipt just written with
	// cp) costs an open about 70 ms. --verify=strict keeps nothing across
	// opens.
	var fl uint32
	if !trunc && !n.stale && n.fsys.cfg.Verify != VerifyStrict {
		fl = fuse.FOPEN_KEEP_CACHE
	}
	if write {
		// A new writer starts over from the last committed version.
		n.failed = nil
		if n.up == nil {
			if err := n.reopenLocked(ctx, !trunc); err != nil {
				return nil, 0, n.fsys.errno("open", n.digestForLog(), err)
			}
		}
		if trunc {
			if err := n.up.Truncate(0); err != nil {
				n.failLocked(err)
				return nil, 0, n.fsys.errno("open", n.digestForLog(), err)
			}
			n.dirty, n.written = true, false
			n.meta.killPriv()
		}
	}
	if fl == 0 {
		n.stale = false // this open drops the kernel's pages
	}
	if write {
		fl |= writeOpen
	}
	return n.newHandleLocked(flags), fl, 0
}

// reopenLocked starts a new upload for a published (or failed) file,
// seeded with the published content when keep is set.
func (n *fileNode) reopenLocked(ctx context.Context, keep bool) error {
	f := n.fsys
	up, err := f.st.NewUpload(ctx)
	if err != nil {
		return err
	}
	if keep && n.pub != nil && n.pub.size > 0 {
		if err := f.seed(ctx, up, n.pub.d); err != nil {
			up.Discard()
			return err
		}
	}
	n.up = up
	n.dirty = !keep || n.pub == nil
	if n.tree != nil {
		n.tree.addLive(n)
	}
	f.stats.uploads.Add(1)
	return nil
}

// seed starts up from blob d's content. The upload reads the blob where
// it has not been written and copies the rest in at its commit
// (store.Upload.Seed), so that opening a large receipt for `>>`, dd
// conv=notrunc or rsync --inplace returns at once; it holds d pinned
// until it ends.
func (f *FS) seed(ctx context.Context, up *store.Upload, d blob.Digest) error {
	pin, err := f.st.Pin(ctx, d)
	if err != nil {
		return err
	}
	r, ok, err := f.st.Get(ctx, d)
	if err == nil && !ok {
		err = blob.Wrap("seed", "", d, blob.ErrMissing)
	}
	if err != nil {
		pin.Release()
		return err
	}
	if f.cfg.Verify == VerifyPublish {
		r.Trust()
	}
	return up.Seed(ctx, r, pin)
}

// failLocked ends the upload after a failed write or publish: nothing of
// it will be published, and every later close reports err.
func (n *fileNode) failLocked(err error) {
	n.failed = err
	n.stale = true
	if n.up != nil {
		n.up.Discard()
		n.up = nil
		if n.tree != nil {
			n.tree.dropLive(n)
		}
	}
	n.dirty = false
}

// commitLocked commits the upload: with an intent (link at the last
// RELEASE) or linked now, replacing the intent of the version before.
func (n *fileNode) commitLocked(ctx context.Context, intent bool) ([]notice, error) {
	f := n.fsys
	up := n.up
	n.up, n.dirty = nil, false
	if n.tree != nil {
		n.tree.dropLive(n)
	}
	size := up.Size()
	var prev namespaces.Intent
	if n.pub != nil {
		prev = n.pub.intent
	}
	// rec is this version's intent, known before the commit: a failed
	// commit's may have landed with its answer lost.
	link, rec, err := f.closeLink(n.ns.name, intent, prev)
	// A close waits for its publish: the client's signals must not cancel
	// half of it (nor can the Go runtime's own SIGURG, for Go clients).
	pctx := context.WithoutCancel(ctx)
	// The pin is released as soon as the commit returns (below): the
	// intent or the reference keeps the blob, so a small put need write
	// no pin row (store.ReleasesPinAtOnce).
	var d blob.Digest
	var pin *store.Pin
	if err == nil {
		d, pin, err = up.Commit(pctx, n.want, link, store.ReleasesPinAtOnce())
	} else {
		up.Discard()
	}
	if err != nil {
		n.failed = err
		n.stale = true
		f.stats.publishFailures.Add(1)
		if n.want != nil && errors.Is(err, blob.ErrVerification) {
			f.log.Warn("verified put by path failed: content does not hash to the file name; nothing published",
				"namespace", n.ns.name, "name", n.name, "err", err)
		} else {
			f.log.Error("publish failed; nothing published", "namespace", n.ns.name, "name", n.logName(), "err", err)
		}
		// The version before, if pending, stays so: its close returned
		// 0, and the last RELEASE links it (docs/publish.md). This one's
		// intent may have committed with its answer lost: this close
		// reports the failure, so it must not publish (Lease.Abandon) —
		// unless the commit was refused whole, when there is nothing to
		// drop and the drop would cost a transaction at the next tick.
		if !refusedWhole(err) {
			f.intents.abandon(rec)
		}
		if n.want != nil {
			n.ns.dropPending(n.name, n)
			return []notice{{&n.ns.Inode, n.name}}, err
		}
		return nil, err
	}
	pin.Release() // the intent or the namespace reference keeps it now
	if prev != 0 {
		f.intents.dropped()
		if n.pub.d != d {
			f.stats.superseded.Add(1)
		}
	}
	if intent {
		f.intents.recorded()
	} else {
		f.stats.publishes.Add(1)
	}
	f.log.Debug("committed", "namespace", n.ns.name, "name", n.logName(), "digest", d.String(), "size", size, "linked", !intent)
	// No notification for the new name: the namespace directory answers
	// ENOENT uncached (no negative entries), so nothing stale can hide
	// it. Announcing names on this hot path would park the thread in the
	// kernel behind any LOOKUP of the directory, and a daemon killed
	// there cannot exit (see "Deadlocks" in the package doc). A put by
	// path's own name was handed to the kernel by CREATE and must be
	// renewed: that rarer path still notifies.
	first := n.pub == nil
	n.pub = &version{d: d, size: size, intent: rec}
	if n.want != nil {
		n.ns.dropPending(n.name, n)
		return []notice{{&n.ns.Inode, n.name}}, nil
	}
	if n.detached {
		return nil, nil // unlinked while open: published, but no receipt
	}
	if first {
		f.stats.receipts.Add(1)
	}
	f.noteReceipt(n) // under n.mu: the list's lock is a leaf
	n.scheduleExpiryLocked()
	return nil, nil
}

// refusedWhole reports whether a close's failed commit wrote nothing,
// so that its intent needs no drop: over the quota, into a namespace that
// is gone, or content that does not hash to its name. The content check
// runs before anything is written; the others fail the transaction that
// would have recorded the intent, which rolls back (meta.NSRows.WriteTx,
// namespaces.Service.Pend), and a put that ran again after a rollback
// reports its last run's own error (meta.Batcher, PostgreSQL's put
// batch). Any other error may be a COMMIT whose answer was lost.
func refusedWhole(err error) bool {
	return errors.Is(err, blob.ErrQuota) || errors.Is(err, namespaces.ErrNotFound) || errors.Is(err, blob.ErrVerification)
}

// closeLink is the store option that commits what a close writes in
// namespace ns with the file's version: an intent (intent, linked at the
// last RELEASE: docs/publish.md) or the reference, either replacing the
// intent of the version before (prev); and the intent it records, if
// any.
func (f *FS) closeLink(ns string, intent bool, prev namespaces.Intent) (store.PutOption, namespaces.Intent, error) {
	p := f.intents.pending(prev)
	if intent {
		part, rec, err := f.svc.PendRows(ns, p)
		return store.WithLink(f.svc, part), rec, err
	}
	part, err := f.svc.SettleRows(ns, p)
	return store.WithLink(f.svc, part), 0, err
}

// settlement is a pending version taken off its file for the settle.
type settlement struct {
	i namespaces.Intent
	d blob.Digest
}

// takeIntentLocked takes the intent off the pending version (the last
// RELEASE): whatever the database answers its settle, this process is
// done with it (a failure is retried by the lease), and a close after
// this one replaces no intent.
func (n *fileNode) takeIntentLocked() settlement {
	s := settlement{i: n.pub.intent, d: n.pub.d}
	n.pub.intent = 0
	return s
}

// settle links the version s into the namespace. It runs without n.mu
// (see Release): it reads nothing of the file's state but its name.
func (n *fileNode) settle(ctx context.Context, s settlement) {
	f := n.fsys
	linked, err := f.intents.settle(context.WithoutCancel(ctx), s.i)
	if err != nil {
		f.log.Error("could not link a closed file into its namespace; retrying", "namespace", n.ns.name, "name", n.logName(),
			"digest", s.d.String(), "err", err)
		return
	}
	f.stats.publishes.Add(1)
	f.log.Debug("published", "namespace", n.ns.name, "name", n.logName(), "digest", s.d.String(), "new_ref", linked)
}

// scheduleExpiryLocked (re)arms the receipt's expiry.
func (n *fileNode) scheduleExpiryLocked() {
	if n.tree == nil {
		return
	}
	n.gen++
	if n.expiry != nil {
		n.expiry.Stop()
	}
	g := n.gen
	n.expiry = time.AfterFunc(n.fsys.cfg.ReceiptTTL, func() { n.expire(g) })
}

func (n *fileNode) expire(g uint64) {
	n.mu.Lock()
	if n.gen != g || n.pub == nil || n.tree.isClosed() {
		n.mu.Unlock()
		return
	}
	p := decide(n.stateLocked(), event{kind: evExpire, inUse: n.handles > 0 || n.up != nil})
	if p.has(stepRearm) {
		n.expiry = time.AfterFunc(n.fsys.cfg.ReceiptTTL, func() { n.expire(g) })
	}
	if p.has(stepDetach) {
		n.detachLocked()
	}
	n.mu.Unlock()
	if p.has(stepDetach) {
		removeName(&n.Inode)
	}
}

// receiptDigest returns the digest of a receipt at rest: published, not
// being written, not open.
func (n *fileNode) receiptDigest() (blob.Digest, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.receiptDigestLocked()
}

// receiptToCheck is receiptDigest for a lookup: false also when the blob
// was seen in the store within the last second (a READDIRPLUS looks up
// every name it just listed).
func (n *fileNode) receiptToCheck() (blob.Digest, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.receiptDigestLocked()
	return d, ok && time.Since(n.seen) > time.Second
}

func (n *fileNode) markSeen(d blob.Digest) {
	n.mu.Lock()
	if n.pub != nil && n.pub.d == d {
		n.seen = time.Now()
	}
	n.mu.Unlock()
}

// dropIfGone removes a receipt whose blob d the store no longer holds (a
// sweep took it after its namespace let go of it), if it is still that
// receipt at rest. It sends the kernel no notification: it runs inside a
// request on the directory, whose lock the kernel holds; the name's
// dentry lapses within the directory's one-second timeout.
func (n *fileNode) dropIfGone(d blob.Digest) bool {
	n.mu.Lock()
	if got, ok := n.receiptDigestLocked(); !ok || got != d {
		n.mu.Unlock()
		return false
	}
	n.detachLocked()
	n.mu.Unlock()
	n.fsys.log.Info("receipt removed: its blob is no longer in the store", "namespace", n.ns.name, "digest", d.String())
	name, parent := n.Inode.Parent()
	if parent != nil && parent.GetChild(name) == &n.Inode {
		parent.RmChild(name)
	}
	n.ForgetPersistent()
	return true
}

func (n *fileNode) receiptDigestLocked() (blob.Digest, bool) {
	if n.tree == nil || n.pub == nil || n.up != nil || n.handles > 0 || n.detached {
		return blob.Digest{}, false
	}
	return n.pub.d, true
}

// gone reports whether the file was taken out of the tree (detach), even
// if its name is still being removed.
func (n *fileNode) gone() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.detached
}

// detach takes the file out of the tree: unlink, rename over it, expiry.
func (n *fileNode) detach() {
	n.mu.Lock()
	n.detachLocked()
	n.mu.Unlock()
	if n.tree != nil {
		n.ForgetPersistent()
	}
}

func (n *fileNode) detachLocked() {
	if n.detached {
		return
	}
	p := decide(n.stateLocked(), event{kind: evUnlink, noWriters: len(n.writers) == 0})
	n.detached = true
	n.gen++
	if n.expiry != nil {
		n.expiry.Stop()
	}
	if n.pub != nil && n.tree != nil {
		n.fsys.stats.receipts.Add(-1)
		n.fsys.receipts.remove(n)
	}
	if p.has(stepDiscard) {
		n.discardUploadLocked()
	}
}

func (n *fileNode) discardUploadLocked() {
	if n.up == nil {
		return
	}
	if n.dirty {
		n.stale = true // its writes are dropped
	}
	n.up.Discard()
	n.up = nil
	n.dirty = false
	if n.tree != nil {
		n.tree.dropLive(n)
	}
}

// discard drops an in-flight upload at unmount or namespace removal.
func (n *fileNode) discard() {
	n.mu.Lock()
	n.detachLocked()
	n.discardUploadLocked()
	n.mu.Unlock()
}

func (n *fileNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr != xattrDigest {
		return n.node.Getxattr(ctx, attr, dest)
	}
	n.mu.Lock()
	pub, staging := n.pub, n.up != nil
	n.mu.Unlock()
	if pub == nil || staging {
		return 0, n.fsys.errno("getxattr", blob.Digest{}, errNoAttr)
	}
	return xattrValue(n.fsys, dest, pub.d.String())
}

func (n *fileNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	n.mu.Lock()
	pub, staging := n.pub, n.up != nil
	n.mu.Unlock()
	if pub == nil || staging {
		return 0, 0
	}
	return xattrValue(n.fsys, dest, xattrDigest+"\x00")
}

// Setxattr: incoming files keep no extended attributes of their own (cp -a
// and tar take ENOTSUP as "not preserved" and go on).
func (n *fileNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return n.fsys.errno("setxattr", blob.Digest{}, errUnsupported)
}

func (n *fileNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.fsys.errno("removexattr", blob.Digest{}, errNoAttr)
}
