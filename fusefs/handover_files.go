package fusefs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// Files of incoming/ across a handover: a file open (for writing or
// reading) or with an upload in flight goes to the successor with its
// node id, its handles, its metadata and its upload, whose content
// passes as a descriptor beside the state (store.Upload.Export), so
// that a writer goes on writing and its last close publishes. A version
// committed by an fsync or a close, whose link waits for the file's last
// release, is a pending link (intent) under the writer lease: the
// successor records its own once told to serve (PendCarried), before it
// serves, and the old daemon cancels its own once the successor serves
// (Commit), so that a crash at any moment leaves the version pending
// under one lease or both, never none. A file reopened without
// truncation whose content is still partly the published blob's passes
// the blob's digest, which the successor pins and reads. What still
// refuses a handover (Blockers, naming the files): a put by path, a
// failed upload, and a link being committed.
// Directories of incoming/ and receipts at rest do not carry: a file in
// a directory goes on without its name, as an unlinked one does.

// Keys of carried files and their handles (nodeKey, fileKey), each with
// its state as base64(JSON).
const (
	keyFile       = "file/"
	keyFileHandle = "fh/"
)

// errHandedBack fails the uploads a successor took and that came back
// to this process when the successor failed after it may have served:
// writes it acknowledged are not in this process's copy.
var errHandedBack = errors.New("the upload went to a new daemon that failed after it served; its writes since are lost")

// carriedFile is a fileNode's state in a handover.
type carriedFile struct {
	NS                  string
	Upload              int // index of its content among the files passed; -1: no upload
	Content             store.Exported
	Mode, UID, GID      uint32
	Atime, Mtime, Ctime time.Time
	Dirty, Written      bool
	Detached, Stale     bool
	Pub                 string `json:",omitempty"` // the last committed version's digest
	PubSize             int64  `json:",omitempty"`
	// Pending: Pub's link waits for the file's last release (an
	// intent); Owing: lookups wait for that release (incTree.owed).
	Pending, Owing bool `json:",omitempty"`
}

// carriedHandle is a fileHandle's state in a handover.
type carriedHandle struct {
	Write, Idle, Wrote bool
}

// notCarriedLocked says why the file cannot go to a successor, "" when
// it can.
func (n *fileNode) notCarriedLocked() string {
	switch {
	case n.want != nil:
		return "put by path"
	case n.failed != nil:
		return "its upload failed"
	case n.owing && n.pub != nil && n.pub.intent == 0:
		// An owing file with no version yet (closed empty, or opened
		// by a redirection's open, dup and close) carries: its RELEASE
		// commits whatever it holds then.
		return "a link being committed"
	case n.up != nil:
		if err := n.up.Exportable(); err != nil {
			return "its upload failed"
		}
	}
	return ""
}

// carriedLocked reports whether the file goes to a successor: open, or
// with an upload in flight.
func (n *fileNode) carriedLocked() bool {
	return n.tree != nil && (n.handles > 0 || n.up != nil)
}

// exporter gives the keys of a handover's export and gathers the
// uploads' descriptors and the files carried.
type exporter struct {
	files   []*os.File
	carried []*fileNode
}

func (x *exporter) nodeKey(in *gofs.Inode) (string, error) {
	n, ok := in.Operations().(*fileNode)
	if !ok {
		return nodeKey(in)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.carriedLocked() {
		return "", nil // a receipt at rest: ESTALE, gone as after a restart
	}
	if why := n.notCarriedLocked(); why != "" {
		// Blockers refused it before the export.
		return "", fmt.Errorf("a file of incoming/ that does not carry across: %s", why)
	}
	c := carriedFile{NS: n.ns.name, Upload: -1, Mode: n.meta.mode, UID: n.meta.uid, GID: n.meta.gid,
		Atime: n.meta.atime, Mtime: n.meta.mtime, Ctime: n.meta.ctime,
		Dirty: n.dirty, Written: n.written, Detached: n.detached, Stale: n.stale}
	if n.pub != nil {
		c.Pub, c.PubSize, c.Pending = n.pub.d.String(), n.pub.size, n.pub.intent != 0
	}
	c.Owing = n.owing
	if n.up != nil {
		f, e, err := n.up.Export()
		if err != nil {
			return "", err
		}
		c.Content = e
		c.Upload = len(x.files)
		x.files = append(x.files, f)
	}
	x.carried = append(x.carried, n)
	return encodeKey(keyFile, c)
}

func (x *exporter) fileKey(in *gofs.Inode, fh gofs.FileHandle) (string, error) {
	h, ok := fh.(*fileHandle)
	if !ok {
		return fileKey(in, fh)
	}
	n := h.n
	n.mu.Lock()
	c := carriedHandle{Write: h.write, Idle: h.idle, Wrote: h.wrote}
	why := n.notCarriedLocked()
	if why == "" && !n.carriedLocked() {
		why = "not a file of incoming/"
	}
	n.mu.Unlock()
	if why != "" {
		// Blockers refused it before the export, unless it changed
		// since: the handover is refused, the mount serves on.
		return "", fmt.Errorf("a handle of a file that does not carry across: %s", why)
	}
	return encodeKey(keyFileHandle, c)
}

// close closes the descriptors exported (once sent, or on a failure).
func (x *exporter) close() {
	for _, f := range x.files {
		f.Close()
	}
	x.files = nil
}

func encodeKey(prefix string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

func decodeKey(key, prefix string, v any) (bool, error) {
	enc, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return false, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		return true, fmt.Errorf("key %.40q: %w", key, err)
	}
	return true, nil
}

// restoreFile rebuilds a carried file of incoming/, with its upload from
// the descriptor passed beside the state.
func (r *restorer) restoreFile(ctx context.Context, c carriedFile) (*fileNode, error) {
	f := r.f
	d, _ := f.nsDirFor(c.NS)
	n := newFileNode(f, d.tree, d, c.Mode, c.UID, c.GID)
	n.meta.atime, n.meta.mtime, n.meta.ctime = c.Atime, c.Mtime, c.Ctime
	n.dirty, n.written, n.detached, n.stale = c.Dirty, c.Written, c.Detached, c.Stale
	if c.Pub != "" {
		dg, err := blob.Parse(c.Pub)
		if err != nil {
			return nil, err
		}
		n.pub = &version{d: dg, size: c.PubSize}
		if c.Pending {
			// Its intent is recorded once this process is told to
			// serve (PendCarried).
			f.carriedPending = append(f.carriedPending, n)
		}
	}
	if c.Owing {
		// As stepOwe: the pending version's digest, else the empty
		// content's (a file with nothing committed yet publishes what
		// it holds at its RELEASE).
		owed := blob.Sum(nil)
		if c.Pending {
			owed = n.pub.d
		}
		n.owing = true
		d.tree.owe(n, owed)
	}
	if c.Upload >= 0 {
		if c.Upload >= len(r.files) || r.files[c.Upload] == nil {
			return nil, fmt.Errorf("upload %d: no such descriptor passed (%d)", c.Upload, len(r.files))
		}
		file := r.files[c.Upload]
		r.files[c.Upload] = nil // the upload's from here
		up, err := f.st.ImportUpload(ctx, file, c.Content)
		if err != nil {
			return nil, err
		}
		n.up = up
		d.tree.addLive(n)
		f.stats.uploads.Add(1)
	}
	return n, nil
}

// restoreFileHandle is a carried handle of n.
func restoreFileHandle(n *fileNode, c carriedHandle) *fileHandle {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := &fileHandle{n: n, write: c.Write, idle: c.Idle, wrote: c.Wrote}
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

// handBack fails the files open for writing that a successor took, once
// it failed after it may have served them: writes it answered are not
// here (also for a file whose upload a close had just committed: the
// next write would start again from that version). Their next write or
// close reports it; a version a close or fsync committed before still
// publishes at the last close (docs/publish.md, Failures).
func handBack(files []*fileNode) {
	for _, n := range files {
		n.mu.Lock()
		if len(n.writers) > 0 || n.up != nil {
			n.failLocked(errHandedBack)
		}
		n.mu.Unlock()
	}
}

// PendCarried records, under this process's writer lease, the pending
// link of every carried file whose last committed version waits for its
// last release: once told to serve, before it serves. The predecessor
// still holds its own until this process serves (Handover.Commit). On a
// failure it cancels those it recorded: the caller abandons the
// takeover, whose lease's close would link them while the predecessor
// goes on writing those files.
func (m *Server) PendCarried(ctx context.Context) error {
	f := m.fs
	for k, n := range f.carriedPending {
		n.mu.Lock()
		d := n.pub.d
		n.mu.Unlock()
		i, err := f.svc.Pend(ctx, n.ns.name, d, f.intents.pending(0))
		if err != nil {
			for _, done := range f.carriedPending[:k] {
				done.mu.Lock()
				i := done.pub.intent
				done.pub.intent = 0
				done.mu.Unlock()
				f.intents.cancel(ctx, i) // a failure is retried by the lease, before its close settles
			}
			return fmt.Errorf("record the pending link of %s in %s: %w", d, n.ns.name, err)
		}
		n.mu.Lock()
		n.pub.intent = i
		n.mu.Unlock()
		f.intents.recorded()
	}
	f.carriedPending = nil
	return nil
}

// dropCarriedIntents cancels this process's pending links of the files
// a successor took, once it serves them with its own (PendCarried): the
// lease's close would otherwise link versions whose files are still
// being written (an earlier version showing beside the one the last
// close publishes).
func (h *Handover) dropCarriedIntents(ctx context.Context) {
	f := h.m.fs
	for _, n := range h.x.carried {
		n.mu.Lock()
		var i namespaces.Intent
		if n.pub != nil {
			i, n.pub.intent = n.pub.intent, 0
		}
		n.mu.Unlock()
		if i == 0 {
			continue
		}
		if err := f.intents.cancelSoon(ctx, i); err != nil {
			// The lease retries the cancel once more as it closes, before
			// it links what it still holds; a registry that refuses that
			// too gets the link.
			f.log.Error("handover: could not cancel a pending link the successor holds too; unless the registry answers by this process's exit, the version is linked now, beside the one the file's last close publishes",
				"namespace", n.ns.name, "digest", n.pub.d.String(), "err", err)
		}
	}
}
