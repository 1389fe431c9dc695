// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fs

// The node table across a handover of the connection (see
// fuse/handover.go): the kernel goes on using the node ids and file
// handles the old server handed out, so the new server must resolve
// them to the same nodes and files, and must never resolve one it does
// not know to anything else.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// TableStateVersion is the format version of TableState; an importer
// refuses a newer one.
const TableStateVersion = 1

// TableState is a server's node table as the kernel sees it: the node
// ids it holds with their lookup counts, and the open file handles,
// each with the embedder's own key to rebuild it. It is plain data:
// encode it with encoding/json or gob.
type TableState struct {
	Version int

	// Epoch is the exporter's file handle epoch: the importer takes
	// Epoch+1, so its own handles never equal an earlier one.
	Epoch uint32

	// NextNodeID is above every node id the exporter ever handed
	// out: the importer allocates from here, so an id the kernel may
	// still hold is never given to another node.
	NextNodeID uint64

	// NextAutomaticIno is the exporter's next automatic inode number.
	NextAutomaticIno uint64

	Nodes []NodeState
	Files []FileState
}

// NodeState is one node id the kernel holds.
type NodeState struct {
	NodeID  uint64
	Lookups uint64

	// The node's StableAttr.
	Ino  uint64
	Gen  uint64
	Mode uint32 // the S_IFMT bits

	// Parent and Name place the node in the tree: a node id
	// (fuse.FUSE_ROOT_ID for the root) and the name in it. Parent is
	// 0 for a node in no directory.
	Parent uint64
	Name   string

	// Key is the embedder's key for the node (ExportState's
	// nodeKey).
	Key string

	// The passthrough backing id registered for the node and the
	// number of its open handles that use it. The registration
	// belongs to the connection, so it survives the handover.
	BackingID   int32
	BackingRefs int
}

// FileState is one open file handle.
type FileState struct {
	Fh     uint64
	NodeID uint64
	// Flags are the flags of the OPEN or CREATE.
	Flags uint32
	// Dir is set for a handle from OPENDIR.
	Dir bool
	// Key is the embedder's key for the handle (ExportState's
	// fileKey). It is empty for the directory handles package fs
	// makes itself (the node has no NodeOpendirHandler): the importer
	// makes a new one, which reads the directory again from the
	// start and seeks to the kernel's offset (FileSeekdirer).
	Key string
}

// ExportState exports the node table of raw, a file system from
// NewNodeFS or NewNodeFSFromState, for a successor's
// NewNodeFSFromState. Call it when no request is being handled (after
// fuse.Server.StopReading). nodeKey gives the embedder's key for a
// node, fileKey for an open handle; an error from either fails the
// export, naming the node.
func ExportState(raw fuse.RawFileSystem, nodeKey func(*Inode) (string, error), fileKey func(*Inode, FileHandle) (string, error)) (*TableState, error) {
	b, ok := raw.(*rawBridge)
	if !ok {
		return nil, fmt.Errorf("fs: ExportState of a %T, not a file system from NewNodeFS", raw)
	}
	type nodeRef struct {
		inode *Inode
		state NodeState
	}
	type fileRef struct {
		inode *Inode
		file  FileHandle
		state FileState
	}
	var nodes []nodeRef
	var files []fileRef

	// backingMu before the table's lock (bridge.go's lock order).
	b.backingMu.Lock()
	t := &b.ids
	t.mu.Lock()
	st := &TableState{
		Version:          TableStateVersion,
		Epoch:            max(t.epoch, t.successorEpochs),
		NextNodeID:       t.nextNodeId,
		NextAutomaticIno: t.automaticIno,
	}
	t.leaveRangeToSuccessor(st)
	for id, e := range t.nodes {
		if id == fuse.FUSE_ROOT_ID || e.lookupCount == 0 {
			continue
		}
		n := e.inode.Load()
		nodes = append(nodes, nodeRef{n, NodeState{
			NodeID:      id,
			Lookups:     e.lookupCount,
			Ino:         n.stableAttr.Ino,
			Gen:         n.stableAttr.Gen,
			Mode:        n.stableAttr.Mode,
			BackingID:   e.backingID,
			BackingRefs: e.backingIDRefcount,
		}})
	}
	addFile := func(fe *fileEntry) {
		if fe == nil || fe.file == nil {
			return
		}
		files = append(files, fileRef{fe.inode, fe.file, FileState{
			Fh:     fe.fh,
			NodeID: fe.inode.nodeId,
			Flags:  fe.openFlags,
			Dir:    fe.dir,
		}})
	}
	for _, fe := range t.files[1:] {
		addFile(fe)
	}
	for _, fe := range t.foreign {
		addFile(fe)
	}
	t.mu.Unlock()
	b.backingMu.Unlock()

	// The keys and the tree outside the table's lock: they take the
	// nodes' locks, which come first.
	for _, r := range nodes {
		name, parent := r.inode.Parent()
		if parent != nil {
			r.state.Parent, r.state.Name = parent.nodeId, name
		}
		key, err := nodeKey(r.inode)
		if err != nil {
			return nil, fmt.Errorf("fs: export node %d (%s): %w", r.state.NodeID, r.inode.Path(nil), err)
		}
		r.state.Key = key
		st.Nodes = append(st.Nodes, r.state)
	}
	for _, r := range files {
		if _, own := r.file.(*dirStreamAsFile); !own {
			key, err := fileKey(r.inode, r.file)
			if err != nil {
				return nil, fmt.Errorf("fs: export file handle %#x of node %d (%s): %w", r.state.Fh, r.state.NodeID, r.inode.Path(nil), err)
			}
			r.state.Key = key
		}
		st.Files = append(st.Files, r.state)
	}
	return st, nil
}

// Restorer rebuilds an exporter's nodes and handles in the importer.
type Restorer struct {
	// Node returns the node for st. parent is the restored parent
	// (the root, or a node restored before), nil if st has none or
	// it could not be restored. The result may be a node that the
	// root's OnAdd made (a persistent child): it takes st's node id.
	// An error, or a nil node, leaves st's id unknown: the kernel's
	// requests for it answer ESTALE.
	Node func(ctx context.Context, st NodeState, parent *Inode) (InodeEmbedder, error)

	// File returns the handle for st, open on node. An error, or a
	// nil handle, leaves st's handle unknown (ESTALE). It is not
	// called for package fs's own directory handles (an empty Key
	// and Dir). If nil, no handle is restored but those.
	File func(ctx context.Context, st FileState, node *Inode) (FileHandle, error)
}

// ImportResult counts what NewNodeFSFromState restored, and what it
// left unknown with the reasons.
type ImportResult struct {
	Nodes, Files int
	Skipped      []error
}

// NewNodeFSFromState is NewNodeFS for a server that takes over a
// connection (fuse.NewServerOnFD): its node table starts as st, the
// predecessor's ExportState, with each node and handle rebuilt by r.
// Node ids and handles the kernel holds and that are not in st, or
// that r could not rebuild, answer ESTALE, never another node: the new
// table allocates node ids above every id of st's and file handles in
// a new epoch. Call it before the server serves.
//
// With Options.ExternalNodeID the node ids are the inode numbers, so
// the no-reuse guarantee is the embedder's.
func NewNodeFSFromState(root InodeEmbedder, opts *Options, st *TableState, r Restorer) (fuse.RawFileSystem, *ImportResult, error) {
	switch {
	case st == nil:
		return nil, nil, errors.New("fs: no table state")
	case st.Version <= 0:
		return nil, nil, errors.New("fs: table state has no version")
	case st.Version > TableStateVersion:
		return nil, nil, fmt.Errorf("fs: table state version %d is newer than this build reads (%d)", st.Version, TableStateVersion)
	case st.Epoch == math.MaxUint32:
		return nil, nil, errors.New("fs: table state: file handle epochs exhausted")
	case r.Node == nil:
		return nil, nil, errors.New("fs: Restorer.Node is nil")
	}
	next := max(st.NextNodeID, fuse.FUSE_ROOT_ID+1)
	byID := make(map[uint64]*NodeState, len(st.Nodes))
	for i := range st.Nodes {
		ns := &st.Nodes[i]
		if ns.NodeID == 0 || ns.NodeID == fuse.FUSE_ROOT_ID || ns.NodeID == math.MaxUint64 {
			return nil, nil, fmt.Errorf("fs: table state: reserved node id %d", ns.NodeID)
		}
		if byID[ns.NodeID] != nil {
			return nil, nil, fmt.Errorf("fs: table state: node id %d twice", ns.NodeID)
		}
		byID[ns.NodeID] = ns
		next = max(next, ns.NodeID+1)
	}

	b := newNodeFS(root, opts, func(b *rawBridge) {
		t := &b.ids
		t.mu.Lock()
		defer t.mu.Unlock()
		t.imported = true
		t.epoch = st.Epoch + 1
		t.foreign = make(map[uint64]*fileEntry, len(st.Files))
		t.nextNodeId = next
		t.automaticIno = max(t.automaticIno, st.NextAutomaticIno)
	})

	res := &ImportResult{}
	ctx := context.Background()
	restored := map[uint64]*Inode{fuse.FUSE_ROOT_ID: b.root}
	visiting := map[uint64]bool{}
	var restore func(id uint64) *Inode
	restore = func(id uint64) *Inode {
		if n, ok := restored[id]; ok {
			return n
		}
		ns := byID[id]
		if ns == nil || visiting[id] {
			return nil
		}
		visiting[id] = true
		var parent *Inode
		if ns.Parent != 0 {
			parent = restore(ns.Parent)
		}
		n, err := b.importNode(ctx, r, ns, parent)
		if err != nil {
			res.Skipped = append(res.Skipped, fmt.Errorf("node %d (key %q): %w", id, ns.Key, err))
		} else {
			res.Nodes++
		}
		restored[id] = n
		return n
	}
	for i := range st.Nodes {
		restore(st.Nodes[i].NodeID)
	}

	for i := range st.Files {
		fs := st.Files[i]
		if err := b.importFile(ctx, r, fs, restored[fs.NodeID], st.Epoch); err != nil {
			res.Skipped = append(res.Skipped, fmt.Errorf("file handle %#x of node %d (key %q): %w", fs.Fh, fs.NodeID, fs.Key, err))
			continue
		}
		res.Files++
	}
	return b, res, nil
}

// importNode registers the node for ns under ns's node id.
func (b *rawBridge) importNode(ctx context.Context, r Restorer, ns *NodeState, parent *Inode) (*Inode, error) {
	ops, err := r.Node(ctx, *ns, parent)
	if err != nil {
		return nil, err
	}
	if ops == nil {
		return nil, errors.New("no node")
	}
	attr := StableAttr{Ino: ns.Ino, Gen: ns.Gen, Mode: ns.Mode & syscall.S_IFMT}
	n := ops.embed()
	if n.bridge == nil {
		initInode(n, ops, attr, b, false, ns.NodeID)
	} else {
		if n.bridge != b {
			return nil, errors.New("the node belongs to another file system")
		}
		if n.stableAttr != attr {
			return nil, fmt.Errorf("the node's StableAttr %+v differs from the exported %+v", n.stableAttr, attr)
		}
	}

	if err := b.registerImported(n, ns, attr); err != nil {
		return nil, err
	}
	if parent != nil && ns.Name != "" {
		parent.AddChild(ns.Name, n, true)
	}
	return n, nil
}

// registerImported enters n in the table under ns's node id, with ns's
// lookup count and backing id.
func (b *rawBridge) registerImported(n *Inode, ns *NodeState, attr StableAttr) error {
	t := &b.ids
	n.mu.Lock()
	defer n.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if n.hasKernelRef {
		return fmt.Errorf("the node was restored already, as node %d", n.nodeId)
	}
	// A node the root's OnAdd made got an id from the counter, above
	// every exported one; the kernel has never seen it, so it can
	// take the id the kernel knows.
	n.nodeId = ns.NodeID
	n.hasKernelRef = true
	n.changeCounter++
	e := &nodeEntry{lookupCount: ns.Lookups, backingID: ns.BackingID, backingIDRefcount: ns.BackingRefs}
	e.inode.Store(n)
	t.nodes[ns.NodeID] = e
	t.stableAttrs[t.dedupKey(attr)] = n
	t.nodeCountHigh = max(t.nodeCountHigh, len(t.nodes))
	return nil
}

// importFile registers the handle fs, of an epoch up to epoch, on the
// restored node n.
func (b *rawBridge) importFile(ctx context.Context, r Restorer, fs FileState, n *Inode, epoch uint32) error {
	if n == nil {
		return errors.New("its node was not restored")
	}
	if fs.Fh == 0 || uint32(fs.Fh>>32) > epoch {
		return errors.New("not a handle of the exporter's")
	}
	var f FileHandle
	if fs.Dir && fs.Key == "" {
		f = defaultDirHandle(n)
	} else if r.File != nil {
		var err error
		if f, err = r.File(ctx, fs, n); err != nil {
			return err
		}
	}
	if f == nil {
		return errors.New("no handle")
	}
	t := &b.ids
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.nodes[n.nodeId]
	if e == nil {
		return errors.New("its node is not registered")
	}
	if t.foreign[fs.Fh] != nil {
		return errors.New("the handle twice")
	}
	fe := &fileEntry{fh: fs.Fh, file: f, inode: n, dir: fs.Dir, openFlags: fs.Flags, nodeIndex: len(e.openFiles)}
	if _, ok := f.(FileReaddirenter); ok {
		fe.lastRead = dirEntryPool.Get().([]fuse.DirEntry)
	}
	e.openFiles = append(e.openFiles, fe.fh)
	t.foreign[fs.Fh] = fe
	return nil
}
