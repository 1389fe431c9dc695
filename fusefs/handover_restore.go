package fusefs

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Keys of nodes and handles in the exported table. A node of a kind
// that does not carry across gets the key "" and stays unknown to the
// successor (ESTALE).
const (
	keyCtlDir   = "ctl"
	keyCtlFile  = "ctl/"  // + the file's name
	keyNS       = "ns/"   // + the namespace
	keyIncoming = "inc/"  // + the namespace
	keyBlob     = "blob/" // + hex/size/linkedAt/tier
	keyHandle   = "h"     // a blob's, a control file's or a directory stream's handle
	// keyStrict + base64(JSON(seqState)): a --verify=strict blob handle
	// whose whole-blob check is under way.
	keyStrict = keyHandle + "/strict/"
)

func nodeKey(in *gofs.Inode) (string, error) {
	switch x := in.Operations().(type) {
	case *ctlDir:
		return keyCtlDir, nil
	case *ctlFile:
		return keyCtlFile + x.name(), nil
	case *nsDir:
		return keyNS + x.name, nil
	case *incDir:
		if x.ns != nil {
			return keyIncoming + x.ns.name, nil
		}
	case *blobFile:
		tier := "kv"
		if x.large {
			tier = "large"
		}
		return fmt.Sprintf("%s%s/%d/%d/%s", keyBlob, x.name, x.size, x.linkedAt, tier), nil
	}
	return "", nil
}

func fileKey(in *gofs.Inode, fh gofs.FileHandle) (string, error) {
	switch x := fh.(type) {
	case *blobHandle:
		if x.seq == nil {
			return keyHandle, nil
		}
		st, err := x.seq.export()
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(st)
		if err != nil {
			return "", err
		}
		return keyStrict + base64.RawURLEncoding.EncodeToString(b), nil
	case *ptHandle, *ctlHandle, *rootStream, *nsStream:
		return keyHandle, nil
	}
	// Blockers refused every other kind before the export.
	return "", fmt.Errorf("a handle of a %T does not carry across", fh)
}

// restorer rebuilds the nodes and handles of a table with f.
type restorer struct {
	f     *FS
	files []*os.File // the uploads' content, by carriedFile.Upload; nil once taken
	byID  map[uint64]*gofs.NodeState
	child map[uint64]map[string]*gofs.NodeState // by parent id, name
	err   error                                 // the first handle that failed: the takeover is refused
}

func newRestorer(f *FS, t *gofs.TableState, files []*os.File) *restorer {
	r := &restorer{f: f, files: files, byID: map[uint64]*gofs.NodeState{}, child: map[uint64]map[string]*gofs.NodeState{}}
	for i := range t.Nodes {
		n := &t.Nodes[i]
		r.byID[n.NodeID] = n
		if r.child[n.Parent] == nil {
			r.child[n.Parent] = map[string]*gofs.NodeState{}
		}
		r.child[n.Parent][n.Name] = n
	}
	return r
}

func (r *restorer) restorer() gofs.Restorer {
	return gofs.Restorer{Node: r.node, File: r.file}
}

func (r *restorer) node(ctx context.Context, st gofs.NodeState, parent *gofs.Inode) (gofs.InodeEmbedder, error) {
	f := r.f
	attr := gofs.StableAttr{Mode: st.Mode, Ino: st.Ino, Gen: st.Gen}
	switch k := st.Key; {
	case k == keyCtlDir:
		return f.root.GetChild(controlName).Operations(), nil
	case strings.HasPrefix(k, keyCtlFile):
		ch := f.root.GetChild(controlName).GetChild(strings.TrimPrefix(k, keyCtlFile))
		if ch == nil {
			return nil, fmt.Errorf("no control file %q in this build", strings.TrimPrefix(k, keyCtlFile))
		}
		return ch.Operations(), nil
	case strings.HasPrefix(k, keyNS):
		d, _ := f.nsDirFor(strings.TrimPrefix(k, keyNS))
		if inc := r.child[st.NodeID][incomingName]; inc != nil && inc.Key == keyIncoming+d.name {
			d.incAttr = gofs.StableAttr{Mode: inc.Mode, Ino: inc.Ino, Gen: inc.Gen}
		}
		d.inodeAttr(ctx, &f.root.Inode, attr)
		return d, nil
	case strings.HasPrefix(k, keyIncoming):
		d, _ := f.nsDirFor(strings.TrimPrefix(k, keyIncoming))
		if !d.inited.Load() {
			return nil, errors.New("its namespace was not restored")
		}
		return d.inc, nil
	case strings.HasPrefix(k, keyBlob):
		return parseBlobKey(f, strings.TrimPrefix(k, keyBlob))
	case strings.HasPrefix(k, keyFile):
		var c carriedFile
		if _, err := decodeKey(k, keyFile, &c); err != nil {
			return nil, err
		}
		n, err := r.restoreFile(ctx, c)
		if err != nil && r.err == nil {
			// A writer's upload that cannot go on: the takeover is
			// refused, the predecessor serves on.
			r.err = fmt.Errorf("restore the file %s of incoming/: %w", st.Name, err)
		}
		return n, err
	}
	return nil, errors.New("not carried across an upgrade")
}

// parseBlobKey is nodeKey's inverse for a blob file.
func parseBlobKey(f *FS, k string) (*blobFile, error) {
	p := strings.Split(k, "/")
	if len(p) != 4 {
		return nil, fmt.Errorf("blob key %q", k)
	}
	if _, err := blob.Parse(p[0]); err != nil {
		return nil, fmt.Errorf("blob key %q: %w", k, err)
	}
	size, err1 := strconv.ParseInt(p[1], 10, 64)
	at, err2 := strconv.ParseInt(p[2], 10, 64)
	if err1 != nil || err2 != nil || (p[3] != "kv" && p[3] != "large") {
		return nil, fmt.Errorf("blob key %q", k)
	}
	return &blobFile{node: node{fsys: f}, name: p[0], size: size, linkedAt: at, large: p[3] == "large"}, nil
}

func (r *restorer) file(ctx context.Context, st gofs.FileState, in *gofs.Inode) (fh gofs.FileHandle, err error) {
	defer func() {
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("restore the handle %#x of %s: %w", st.Fh, in.Path(nil), err)
		}
	}()
	switch x := in.Operations().(type) {
	case *blobFile:
		ns := r.byID[st.NodeID]
		seq, err := parseStrictKey(x, st.Key)
		if err != nil {
			return nil, err
		}
		return x.restoreHandle(ctx, ns != nil && ns.BackingID != 0, seq)
	case *ctlFile:
		x.fsys.stats.controlHandles.Add(1)
		return &ctlHandle{c: x}, nil
	case *fileNode:
		var c carriedHandle
		if ok, err := decodeKey(st.Key, keyFileHandle, &c); !ok || err != nil {
			return nil, cmp.Or(err, fmt.Errorf("a handle of a file of incoming/ without its state (key %q)", st.Key))
		}
		return restoreFileHandle(x, c), nil
	case *rootDir:
		h, _, errno := x.OpendirHandle(ctx, st.Flags)
		if errno != 0 {
			return nil, errno
		}
		return h, nil
	case *nsDir:
		h, _, errno := x.OpendirHandle(ctx, st.Flags)
		if errno != 0 {
			return nil, errno
		}
		return h, nil
	}
	return nil, fmt.Errorf("a handle of a %T does not carry across", in.Operations())
}

// parseStrictKey is the whole-blob check a blob handle's key carries
// (fileKey), nil when it carries none.
func parseStrictKey(b *blobFile, key string) (*seqCheck, error) {
	enc, ok := strings.CutPrefix(key, keyStrict)
	if !ok {
		return nil, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("strict check: %w", err)
	}
	var st seqState
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("strict check: %w", err)
	}
	return restoreSeqCheck(b.digest(), b.size, st)
}

// restoreHandle is Open for a handle the predecessor opened: the pin
// and the shared reader are this process's, the I/O mode the one the
// kernel holds (pt: the node has a passthrough backing file, which the
// kernel reads without us). seq is a --verify=strict handle's
// whole-blob check as the predecessor left it (nil: none, or a
// predecessor that did not carry it).
func (b *blobFile) restoreHandle(ctx context.Context, pt bool, seq *seqCheck) (gofs.FileHandle, error) {
	f, dg := b.fsys, b.digest()
	pin, err := f.st.Pin(ctx, dg)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.open
	if o == nil {
		r, ok, err := f.st.Get(ctx, dg)
		if err == nil && !ok {
			err = blob.Wrap("open", "", dg, blob.ErrMissing)
		}
		if err != nil {
			pin.Release()
			return nil, err
		}
		o = &blobOpen{rd: r}
		if f.cfg.Verify == VerifyPublish {
			o.rd.Trust()
		}
		b.open = o
	}
	o.n++
	f.refs.add(dg)
	f.stats.openHandles.Add(1)
	h := &blobHandle{b: b, d: dg, rd: o.rd, pin: pin, seq: seq}
	f.trackBlobHandle(h)
	if !pt {
		o.cached++
		return h, nil
	}
	// The kernel goes on reading through the backing file the
	// predecessor registered (the connection's, not a process's). Ours
	// is needed only if go-fuse asks for one; this reader may offer
	// none (not yet verified whole in --verify=full), and then the
	// handle is a plain one in passthrough mode: never a ptHandle
	// offering a descriptor it does not have.
	o.pt++
	if !o.ptOK {
		o.ptFd, o.ptOK = o.rd.Passthrough()
	}
	h.pt, h.ptFd, h.ptOK = true, o.ptFd, o.ptOK
	if !h.ptOK {
		return h, nil
	}
	return &ptHandle{h}, nil
}
