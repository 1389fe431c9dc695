package fusefs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Handing the live mount to a new process (issue 37, `alkblobfs
// upgrade`). The old daemon stops reading (fuse.Server.StopReading),
// exports what INIT settled and its node table (package fs's
// ExportState, with a key of ours for each node and handle: keys.go's
// nodeKey and fileKey) and passes a duplicate of the /dev/fuse
// descriptor; the new one rebuilds the nodes and handles from the keys
// (restorer), takes its own pin on every blob it will serve through an
// inherited handle, and starts a server on the descriptor without
// serving yet. Only then does the old one Detach and release its pins,
// and the new one asks the kernel to resend what the old one read and
// did not answer (NotifyResend), and serves.
//
// What carries across: every node id and lookup count the kernel holds
// for the root, the namespaces, incoming/ itself, blob files and the
// control directory and files; every open handle of a blob file (its
// passthrough registration is the connection's and stays), of a control
// file and of a directory, which goes on from the kernel's offset; a
// --verify=strict handle's whole-blob check (seqState, in the handle's
// key); files of incoming/ open or being written, with their uploads and
// pending links (handover_files.go). What does not: receipts at rest,
// directories and symbolic links made in incoming/, which the new
// process does not know (the kernel's ids for them answer ESTALE, and
// their names are gone as after a restart), and the files Blockers
// lists, which refuse the handover until they close.

// HandoverVersion is the format version of the state a handover passes.
// A build reads its own and older versions and refuses newer ones.
// Version 2 carries files of incoming/ (handover_files.go) and a
// --verify=strict handle's check (keyStrict); a state with neither is
// written as version 1 (formatVersion), which a build before them reads.
const HandoverVersion = 2

// formatVersion is the oldest format version that reads tbl: 1 unless it
// holds keys version 2 added, so that a downgrade with nothing of those
// to carry still works.
func formatVersion(tbl *gofs.TableState) int {
	v2 := func(key string) bool {
		return strings.HasPrefix(key, keyFile) || strings.HasPrefix(key, keyFileHandle) || strings.HasPrefix(key, keyStrict)
	}
	for _, n := range tbl.Nodes {
		if v2(n.Key) {
			return 2
		}
	}
	for _, f := range tbl.Files {
		if v2(f.Key) {
			return 2
		}
	}
	return 1
}

// handoverState is what passes from the old process to the new, beside
// the descriptor: plain data, as JSON.
type handoverState struct {
	Version int
	Dir     string
	Init    fuse.InitState
	Table   *gofs.TableState
	// Fixed are the options the kernel holds the mount to (mount(2)'s
	// options, INIT's reply): the new process must want the same.
	Fixed map[string]string
	// SweepEvery is the sweep timer as the control file left it (ns; 0
	// off).
	SweepEvery int64
	// Uploads is how many descriptors of uploads follow the state
	// (Handover.Files), in the order carriedFile.Upload counts.
	Uploads int `json:",omitempty"`
}

// UploadsIn is how many descriptors of uploads follow a handover's state
// (0 for a state it cannot read: TakeOver refuses it).
func UploadsIn(state []byte) int {
	var v struct{ Uploads int }
	if json.Unmarshal(state, &v) != nil || v.Uploads < 0 || v.Uploads > maxUploads {
		return 0
	}
	return v.Uploads
}

// maxUploads bounds the descriptors a successor receives.
const maxUploads = 1 << 16

// ErrBusy is what a handover that files open in incoming/ refuse wraps.
var ErrBusy = errors.New("files open in incoming/")

// Blockers lists, as paths under the mountpoint, the files in incoming/
// that keep a handover from starting, each with why (notCarriedLocked):
// puts by path, failed uploads, and links being committed. Empty when
// none.
func (m *Server) Blockers() []string { return m.blockers(true) }

// blockers is Blockers; settling false leaves out the links being
// committed at a RELEASE, which end by themselves within milliseconds:
// BeginHandover waits for them once it has stopped reading, so that an
// upgrade run while files are being copied in does not fail for them.
func (m *Server) blockers(settling bool) []string {
	var out []string
	for _, d := range m.fs.nsDirs() {
		d.mu.Lock()
		for name := range d.pending {
			out = append(out, d.name+"/"+name+" (put by path)")
		}
		d.mu.Unlock()
		if d.inited.Load() {
			// A put by path that failed and is still open has left
			// pending; its node is still the namespace's child.
			for name, ch := range d.Children() {
				if n, ok := ch.Operations().(*fileNode); ok && n.tree == nil {
					n.mu.Lock()
					open := n.handles > 0
					n.mu.Unlock()
					if open && !slices.Contains(out, d.name+"/"+name+" (put by path)") {
						out = append(out, d.name+"/"+name+" (put by path)")
					}
				}
			}
		}
		t := d.tree
		t.mu.Lock()
		var files []*fileNode
		for n := range t.live {
			files = append(files, n)
		}
		for n := range t.owed {
			files = append(files, n)
		}
		settlingN := 0
		if settling {
			settlingN = len(t.settling)
		}
		t.mu.Unlock()
		if d.inited.Load() {
			walkIncoming(d.inc.EmbeddedInode(), func(n *fileNode) {
				n.mu.Lock()
				open := n.handles > 0
				n.mu.Unlock()
				if open {
					files = append(files, n)
				}
			})
		}
		seen := map[*fileNode]bool{}
		for _, n := range files {
			if seen[n] {
				continue
			}
			seen[n] = true
			n.mu.Lock()
			why := n.notCarriedLocked()
			n.mu.Unlock()
			if why == "" {
				continue
			}
			p := n.Path(nil)
			if p == "" {
				p = d.name + "/" + incomingName + "/(unlinked)"
			}
			out = append(out, p+" ("+why+")")
		}
		for range settlingN {
			out = append(out, d.name+"/"+incomingName+"/(a link being committed)")
		}
	}
	slices.Sort(out)
	return out
}

// walkIncoming calls fn for every file below the incoming/ inode in.
func walkIncoming(in *gofs.Inode, fn func(*fileNode)) {
	if in == nil {
		return
	}
	for _, ch := range in.Children() {
		switch x := ch.Operations().(type) {
		case *fileNode:
			fn(x)
		case *incDir:
			walkIncoming(ch, fn)
		}
	}
}

// busyError is the refusal for blockers.
func busyError(blockers []string) error {
	const shown = 10
	list := strings.Join(blockers[:min(len(blockers), shown)], ", ")
	if len(blockers) > shown {
		list += fmt.Sprintf(", and %d more", len(blockers)-shown)
	}
	word := "files"
	if len(blockers) == 1 {
		word = "file"
	}
	return fmt.Errorf("%w: %d %s in incoming/ not carried across an upgrade: %s; retry when they close", ErrBusy, len(blockers), word, list)
}

// Handover is the old process's side of a handover in progress: the
// mount is stopped (no request is being answered) until Commit or
// Resume.
type Handover struct {
	m     *Server
	fd    int // a duplicate of the connection's descriptor, for the successor; -1 once closed
	state []byte
	x     *exporter // the uploads' descriptors and the files of incoming/ carried
	told  bool      // the successor was told to serve (Told)
}

// BeginHandover stops serving and exports the mount for a successor. It
// refuses (ErrBusy, naming them) while Blockers lists anything. version
// is the state's format version: HandoverVersion (written as the oldest
// that reads the state, formatVersion), or another for tests of the
// successor's refusal. On an error the mount serves on.
func (m *Server) BeginHandover(stopTimeout time.Duration, version int) (*Handover, error) {
	if b := m.blockers(false); len(b) > 0 {
		return nil, busyError(b)
	}
	if !m.server.SupportsResend() {
		return nil, errors.New("the kernel did not offer FUSE_HAS_RESEND (Linux 6.9 or later): a request in flight would be lost; unmount and mount again instead")
	}
	if err := m.server.StopReading(stopTimeout); err != nil {
		return nil, fmt.Errorf("stop serving: %w", err)
	}
	h := &Handover{m: m, fd: -1, x: &exporter{}}
	fail := func(err error) (*Handover, error) {
		if rerr := h.Resume(); rerr != nil {
			err = fmt.Errorf("%w; resuming: %v", err, rerr)
		}
		return nil, err
	}
	// The links that RELEASEs read before the stop are committing: they
	// need no request, only the database, so they end while nothing is
	// read (hurried: nothing more will share their transaction).
	until := time.Now().Add(settleWait)
	for _, d := range m.fs.nsDirs() {
		d.tree.awaitSettled(until)
	}
	// A file opened between the check and the stop.
	if b := m.Blockers(); len(b) > 0 {
		return fail(busyError(b))
	}
	tbl, err := gofs.ExportState(m.bridge, h.x.nodeKey, h.x.fileKey)
	if err != nil {
		return fail(fmt.Errorf("export the node table: %w", err))
	}
	if version == HandoverVersion {
		version = formatVersion(tbl)
	}
	st := handoverState{
		Version:    version,
		Dir:        m.dir,
		Init:       m.server.InitState(),
		Table:      tbl,
		Fixed:      m.fs.fixedOptions(),
		SweepEvery: int64(m.fs.upkeep.Sweeper.Every()),
		Uploads:    len(h.x.files),
	}
	if h.state, err = json.Marshal(st); err != nil {
		return fail(err)
	}
	if h.fd, err = m.server.DupFD(); err != nil {
		return fail(fmt.Errorf("duplicate the connection's descriptor: %w", err))
	}
	m.fs.log.Info("handover: stopped serving and exported the mount", "mountpoint", m.dir,
		"nodes", len(tbl.Nodes), "handles", len(tbl.Files), "incoming_files", len(h.x.carried), "uploads", len(h.x.files), "state_bytes", len(h.state))
	return h, nil
}

// FD is the descriptor to pass to the successor (SCM_RIGHTS); the
// Handover closes it at CloseFD, Resume or Commit.
func (h *Handover) FD() int { return h.fd }

// State is the state to pass beside FD.
func (h *Handover) State() []byte { return h.state }

// Files are the descriptors of the uploads carried, to pass beside the
// state in this order (TakeOver's files); closed at CloseFD.
func (h *Handover) Files() []*os.File { return h.x.files }

// CloseFD closes the duplicate descriptors (once they have been sent).
func (h *Handover) CloseFD() {
	if h.fd >= 0 {
		syscall.Close(h.fd)
		h.fd = -1
	}
	h.x.close()
}

// Told notes that the successor is being told to serve: from here it
// may answer writes to the files of incoming/ it took, so a Resume
// fails them rather than go on without those writes.
func (h *Handover) Told() { h.told = true }

// Refused notes that the successor, told to serve, refused before it
// served (it answered nothing): Resume goes on with the files of
// incoming/ it took, as after a refusal before Told.
func (h *Handover) Refused() { h.told = false }

// Resume serves again: the successor failed before it served, or was
// killed before it said it serves (the caller has reaped it). The kernel
// resends what came in meanwhile, and what the successor read and did
// not answer; ids and handles it gave out answer ESTALE here (package
// fs keeps their ranges apart). The pid record is this process's again.
func (h *Handover) Resume() error {
	h.CloseFD()
	if h.told {
		handBack(h.x.carried)
	}
	if err := h.m.server.ResumeReading(); err != nil {
		return err
	}
	if h.told {
		// The successor may have answered RELEASEs and FORGETs: they
		// never reach this process, whose handles and nodes (and their
		// pins) then stay until the mount ends.
		h.m.fs.log.Error("handover: the new daemon failed after it was told to serve; handles it closed and names it forgot meanwhile stay open here, with their pins, until the mount is unmounted: remount it when convenient",
			"mountpoint", h.m.dir)
	}
	if err := writePidFile(h.m.dir); err != nil {
		h.m.fs.log.Warn("handover abandoned: could not record the daemon's pid again", "err", err)
	}
	h.m.fs.log.Info("handover abandoned; serving again", "mountpoint", h.m.dir)
	return nil
}

// Commit lets go of the mount once the successor serves it: this server
// ends without unmounting, and the cleanup releases the pins and
// readers of every open handle (the successor took its own before it
// said ready), the writer lease and the liveness source, and leaves
// the pid record (the successor's). It returns once that is done (Done
// is closed), or after timeout with a warning. This server never reads
// again: should it fail to detach, its readers stay parked and the
// process's exit closes the descriptor.
func (h *Handover) Commit(timeout time.Duration) {
	h.CloseFD()
	m := h.m
	m.handedOver.Store(true)
	if err := m.guard.retire(timeout); err != nil {
		m.fs.log.Warn("handover: the mount guard lingers; it leaves the successor's connection alone", "err", err)
	}
	m.fs.upkeep.Scrubber.Stop()
	h.dropCarriedIntents(context.Background())
	if err := m.server.Detach(timeout); err != nil {
		m.fs.log.Error("handover: could not detach from the connection; the successor serves it, this process cleans up and exits", "err", err)
		go m.cleanup()
	}
	select {
	case <-m.done:
	case <-time.After(timeout):
		m.fs.log.Warn("handover: the old server's cleanup is slow; the successor serves", "waited", timeout)
	}
}

// fixedOptions are the options the kernel holds a mount to for its
// life: the mount's (mount(2) flags and -o options) and INIT's. A
// successor that would want others is refused, naming the option.
func (f *FS) fixedOptions() map[string]string {
	o := f.nodeOptions().MountOptions
	return map[string]string{
		"--allow-other":          strconv.FormatBool(f.cfg.AllowOther),
		"--read-only":            strconv.FormatBool(f.cfg.ReadOnly),
		"--source":               cmp.Or(f.cfg.Source, "alkblobfs"),
		"mount options":          strings.Join(o.Options, ","),
		"max_write":              strconv.Itoa(o.MaxWrite),
		"max_readahead":          strconv.Itoa(o.MaxReadAhead),
		"max_background":         strconv.Itoa(o.MaxBackground),
		"capabilities":           fmt.Sprintf("%#x", o.ExtraCapabilities),
		"explicit cache control": strconv.FormatBool(o.ExplicitDataCacheControl),
	}
}

// checkFixed compares the options the mount was made with (have) with
// this process's (want), naming the first that differs.
func checkFixed(have, want map[string]string) error {
	keys := make([]string, 0, len(have)+len(want))
	for k := range have {
		keys = append(keys, k)
	}
	for k := range want {
		if _, ok := have[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		h, hok := have[k]
		w, wok := want[k]
		switch {
		case !hok:
			return fmt.Errorf("option %s: the mount does not record it (an older build), and this build sets it to %q; it is fixed when the mount is made: unmount and mount again", k, w)
		case !wok:
			return fmt.Errorf("option %s: the mount has %q, and this build does not know it; it is fixed when the mount is made: unmount and mount again", k, h)
		case h != w:
			return fmt.Errorf("option %s: the mount has %q and this build would have %q; it is fixed when the mount is made: unmount and mount again to change it", k, h, w)
		}
	}
	return nil
}

// decodeHandover parses a handover's state, refusing a version this
// build does not read.
func decodeHandover(b []byte) (*handoverState, error) {
	var v struct{ Version int }
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("handover state: %w", err)
	}
	switch {
	case v.Version <= 0:
		return nil, errors.New("handover state: no version")
	case v.Version > HandoverVersion:
		return nil, fmt.Errorf("handover state version %d is newer than this build reads (%d): the running daemon is a newer alkblobfs than the one it was asked to start", v.Version, HandoverVersion)
	}
	var st handoverState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("handover state: %w", err)
	}
	if st.Table == nil {
		return nil, errors.New("handover state: no node table")
	}
	if st.Uploads < 0 || st.Uploads > maxUploads {
		return nil, fmt.Errorf("handover state: %d uploads", st.Uploads)
	}
	if err := st.Init.Check(); err != nil {
		return nil, err
	}
	return &st, nil
}

// TakeOver is the new process's side: it builds the mount from a
// predecessor's state on the connection fd (which it owns from the call
// on: closed on an error), with cfg, and restores every node and handle,
// taking a pin on every blob open through an inherited handle. It does
// not serve: Serve does, once the predecessor has let go; Abandon undoes
// it. Any handle it cannot restore refuses the takeover: the
// predecessor serves on.
func TakeOver(fd int, state []byte, files []*os.File, cfg Config) (*Server, error) {
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close() // not taken by an upload
			}
		}
	}()
	st, err := decodeHandover(state)
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	f, err := newFS(cfg)
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := checkFixed(st.Fixed, f.fixedOptions()); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	f.intents.start(st.Dir)
	abandon := func(err error) (*Server, error) {
		f.abandonTakeover()
		return nil, err
	}
	opts := f.nodeOptions()
	if len(files) != st.Uploads {
		syscall.Close(fd)
		return abandon(fmt.Errorf("handover: %d descriptors of uploads received, the state names %d", len(files), st.Uploads))
	}
	rs := newRestorer(f, st.Table, files)
	bridge, res, err := gofs.NewNodeFSFromState(f.root, opts, st.Table, rs.restorer())
	if err != nil {
		syscall.Close(fd)
		return abandon(fmt.Errorf("restore the node table: %w", err))
	}
	if rs.err != nil {
		syscall.Close(fd)
		return abandon(rs.err)
	}
	if res.Files != len(st.Table.Files) {
		syscall.Close(fd)
		return abandon(fmt.Errorf("restored %d of %d open handles: %v", res.Files, len(st.Table.Files), errors.Join(res.Skipped...)))
	}
	server, err := fuse.NewServerOnFD(f.observed(bridge), fd, st.Init, &opts.MountOptions)
	if err != nil {
		return abandon(fmt.Errorf("option fixed at INIT: %w", err))
	}
	if st.SweepEvery != int64(f.upkeep.Sweeper.Every()) && !cfg.ReadOnly {
		cmd := "off"
		if st.SweepEvery > 0 {
			cmd = time.Duration(st.SweepEvery).String()
		}
		if _, err := f.upkeep.Sweeper.Set(cmd); err != nil {
			f.log.Warn("handover: could not keep the sweep timer", "timer", cmd, "err", err)
		}
	}
	m := &Server{fs: f, server: server, bridge: bridge, dir: st.Dir, done: make(chan struct{})}
	f.mount = m
	f.log.Info("handover: restored the mount", "mountpoint", st.Dir, "nodes", res.Nodes, "of", len(st.Table.Nodes),
		"handles", res.Files, "left_stale", len(res.Skipped))
	for _, e := range res.Skipped {
		f.log.Debug("handover: left stale", "what", e.Error())
	}
	return m, nil
}

// Serve starts serving a mount from TakeOver, while the predecessor,
// stopped, still holds its pins: the kernel resends what the
// predecessor read and did not answer. The resend comes before the
// first read: a request resent while a reader of this server handles it
// would run twice (a second OPEN's handle and pin the kernel never
// learns of, a second RELEASE of a handle slot already given to a new
// open).
func (m *Server) Serve() { m.serveResent("took over", "the old daemon") }

// serveResent serves a connection another process served before (a
// takeover's, a restart's): the kernel first resends what that process
// read and never answered (predecessor names it in a warning).
func (m *Server) serveResent(msg, predecessor string) {
	if st := m.server.NotifyResend(); !st.Ok() {
		m.fs.log.Warn("NOTIFY_RESEND failed: requests "+predecessor+" left unanswered may wait", "status", st)
	}
	go m.server.Serve()
	m.start(msg)
}

// Abandon undoes TakeOver when the predecessor does not let go: the
// pins are released and the descriptor's server never serves (the
// process exits after it, which closes it).
func (m *Server) Abandon() { m.fs.abandonTakeover() }

// abandonTakeover releases what a takeover took: pins and the writer
// lease. The uploads of incoming/ it imported hold descriptors only,
// which the process's exit closes (the predecessor's uploads go on).
func (f *FS) abandonTakeover() {
	f.releaseBlobHandles()
	f.intents.close()
	f.cancel()
}

// CheckHandover is BeginHandover's first check, without stopping: nil
// when nothing in incoming/ keeps a handover from starting.
func (m *Server) CheckHandover() error {
	if b := m.blockers(false); len(b) > 0 {
		return busyError(b)
	}
	return nil
}

// HandedOver reports whether the mount went to a successor: Done was
// closed without an unmount.
func (m *Server) HandedOver() bool { return m.handedOver.Load() }
