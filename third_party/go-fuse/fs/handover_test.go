// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fs

// Tests of the handover of a live connection (handover.go,
// fuse/handover.go): server A serves a small tree; a client process (this
// test binary, re-executed) keeps files open and its working directory
// inside; A stops, exports, and B takes the same /dev/fuse description
// over. They need root and /dev/fuse.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// hoContent is the tree every server of a test serves: path -> bytes
// ("" is the root, a trailing "/" a directory). Each file has bytes of
// its own, so a read shows whose they are.
var hoContent = map[string][]byte{
	"a":   bytes.Repeat([]byte("a"), 64<<10),
	"b":   bytes.Repeat([]byte("B"), 64<<10),
	"d/":  nil,
	"d/c": []byte("c inside d"),
}

// hoIno gives every path a fixed inode number, the same in every server.
var hoIno = map[string]uint64{"a": 10, "b": 11, "d/": 12, "d/c": 13}

// hoDir is a directory of the tree; key is its path with a trailing
// slash, "" for the root.
type hoDir struct {
	Inode
	key string
}

var _ = (NodeLookuper)((*hoDir)(nil))
var _ = (NodeReaddirer)((*hoDir)(nil))

func (d *hoDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*Inode, syscall.Errno) {
	ops, attr, ok := hoNode(d.key + name)
	if !ok {
		return nil, syscall.ENOENT
	}
	if f, ok := ops.(*hoFile); ok {
		out.Attr.Size = uint64(len(f.data))
		out.Attr.Mode = 0444
	}
	return d.NewInode(ctx, ops, attr), 0
}

func (d *hoDir) Readdir(ctx context.Context) (DirStream, syscall.Errno) {
	var es []fuse.DirEntry
	for key := range hoContent {
		rest, ok := strings.CutPrefix(key, d.key)
		if !ok || rest == "" || strings.Contains(strings.TrimSuffix(rest, "/"), "/") {
			continue
		}
		mode := uint32(syscall.S_IFREG)
		if strings.HasSuffix(rest, "/") {
			mode = syscall.S_IFDIR
		}
		es = append(es, fuse.DirEntry{Name: strings.TrimSuffix(rest, "/"), Mode: mode, Ino: hoIno[key]})
	}
	return NewListDirStream(es), 0
}

// hoNode makes the node for key, or reports there is none.
func hoNode(key string) (InodeEmbedder, StableAttr, bool) {
	if data, ok := hoContent[key]; ok && !strings.HasSuffix(key, "/") {
		return &hoFile{key: key, data: data}, StableAttr{Mode: syscall.S_IFREG, Ino: hoIno[key]}, true
	}
	if _, ok := hoContent[key+"/"]; ok {
		key += "/"
	}
	if _, ok := hoContent[key]; ok && strings.HasSuffix(key, "/") {
		return &hoDir{key: key}, StableAttr{Mode: syscall.S_IFDIR, Ino: hoIno[key]}, true
	}
	return nil, StableAttr{}, false
}

type hoFile struct {
	Inode
	key  string
	data []byte
}

var _ = (NodeOpener)((*hoFile)(nil))
var _ = (NodeGetattrer)((*hoFile)(nil))

func (f *hoFile) Open(ctx context.Context, flags uint32) (FileHandle, uint32, syscall.Errno) {
	// Direct I/O: every read reaches the server, so a read shows
	// which server and which handle answered it.
	return &hoHandle{key: f.key, data: f.data}, fuse.FOPEN_DIRECT_IO, 0
}

func (f *hoFile) Getattr(ctx context.Context, fh FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Size = uint64(len(f.data))
	out.Mode = 0444
	return 0
}

// hoHandle is an open file; key names it across a handover.
type hoHandle struct {
	key  string
	data []byte
}

var _ = (FileReader)((*hoHandle)(nil))

func (h *hoHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(h.data)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(h.data)))
	return fuse.ReadResultData(h.data[off:end]), 0
}

func hoNodeKey(n *Inode) (string, error) {
	switch ops := n.Operations().(type) {
	case *hoFile:
		return ops.key, nil
	case *hoDir:
		return ops.key, nil
	}
	return "", fmt.Errorf("node of type %T", n.Operations())
}

func hoFileKey(n *Inode, f FileHandle) (string, error) {
	if h, ok := f.(*hoHandle); ok {
		return h.key, nil
	}
	return "", fmt.Errorf("handle of type %T", f)
}

var hoRestorer = Restorer{
	Node: func(ctx context.Context, st NodeState, parent *Inode) (InodeEmbedder, error) {
		ops, attr, ok := hoNode(strings.TrimSuffix(st.Key, "/"))
		if !ok {
			return nil, fmt.Errorf("no %q in the tree", st.Key)
		}
		if attr.Ino != st.Ino {
			return nil, fmt.Errorf("%q is inode %d, was %d", st.Key, attr.Ino, st.Ino)
		}
		return ops, nil
	},
	File: func(ctx context.Context, st FileState, n *Inode) (FileHandle, error) {
		f, ok := n.Operations().(*hoFile)
		if !ok || f.key != st.Key {
			return nil, fmt.Errorf("handle %q on node %T", st.Key, n.Operations())
		}
		return &hoHandle{key: f.key, data: f.data}, nil
	},
}

func hoOptions() *Options {
	// No caching: every lookup and getattr reaches the server, so
	// the kernel's node ids are exercised after the handover.
	var zero time.Duration
	return &Options{EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero}
}

func hoMountOptions() *fuse.MountOptions {
	return &fuse.MountOptions{Name: "handovertest", Debug: os.Getenv("GOFUSE_HANDOVER_DEBUG") != ""}
}

// hoServer is one server of a test and the channel its Serve returns on.
type hoServer struct {
	srv    *fuse.Server
	raw    fuse.RawFileSystem
	served chan struct{}
}

func (s *hoServer) serve() {
	s.served = make(chan struct{})
	go func() {
		s.srv.Serve()
		close(s.served)
	}()
}

// hoMount mounts server A, and unmounts the mount (whoever serves it
// then) at the end of the test.
func hoMount(t *testing.T) (string, *hoServer) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	mnt := t.TempDir()
	raw := NewNodeFS(&hoDir{}, hoOptions())
	srv, err := fuse.NewServer(raw, mnt, hoMountOptions())
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	a := &hoServer{srv: srv, raw: raw}
	a.serve()
	if err := srv.WaitMount(); err != nil {
		t.Fatalf("WaitMount: %v", err)
	}
	if !srv.SupportsResend() {
		srv.Unmount()
		t.Skip("the kernel does not offer FUSE_HAS_RESEND")
	}
	t.Cleanup(func() {
		// The mount outlives A when B took it over: detach it
		// by path, whoever serves it.
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt, a
}

// connAbort aborts the mount's FUSE connection, so that a test that
// gives up does not hang on a request nobody answers.
func connAbort(t *testing.T, mnt string) {
	var st syscall.Stat_t
	if err := syscall.Stat(mnt, &st); err != nil {
		t.Logf("abort: stat %s: %v", mnt, err)
		return
	}
	p := fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", unix.Minor(uint64(st.Dev)))
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		t.Logf("abort: %v", err)
	}
}

// handoverOpts shapes a handover in a test.
type handoverOpts struct {
	// edit changes the exported table before B imports it.
	edit func(*TableState)
	// noResend starts B without FUSE_NOTIFY_RESEND (the test sends
	// it itself).
	noResend bool
	// unguarded turns B's guard off after the import: its handles
	// restart at 1 in epoch 0 and unknown ids panic, as in go-fuse
	// before the patch.
	unguarded bool
	// beforeB runs between A's stop and B's start.
	beforeB func()
}

// handover stops A, exports its INIT and node table (through JSON, as
// a process would), passes its fd through a unix socket (SCM_RIGHTS)
// and starts B with them; A then detaches.
func handover(t *testing.T, mnt string, a *hoServer, o handoverOpts) *hoServer {
	t.Helper()
	start := time.Now()
	if err := a.srv.StopReading(10 * time.Second); err != nil {
		connAbort(t, mnt)
		t.Fatalf("StopReading: %v", err)
	}
	stopped := time.Since(start)
	init := a.srv.InitState()
	table, err := ExportState(a.raw, hoNodeKey, hoFileKey)
	if err != nil {
		t.Fatalf("ExportState: %v", err)
	}
	var initB fuse.InitState
	var tableB TableState
	jsonRoundTrip(t, init, &initB)
	jsonRoundTrip(t, table, &tableB)
	if o.edit != nil {
		o.edit(&tableB)
	}
	fd := passFD(t, a.srv)
	if o.beforeB != nil {
		o.beforeB()
	}

	raw, res, err := NewNodeFSFromState(&hoDir{}, hoOptions(), &tableB, hoRestorer)
	if err != nil {
		t.Fatalf("NewNodeFSFromState: %v", err)
	}
	if len(res.Skipped) > 0 {
		t.Fatalf("import skipped: %v", res.Skipped)
	}
	if o.unguarded {
		ids := &raw.(*rawBridge).ids
		ids.epoch, ids.imported = 0, false
	}
	mo := hoMountOptions()
	if o.unguarded {
		// Unguarded, B panics on the handles it does not know,
		// as go-fuse did (the client's last close reaches one):
		// answer EIO without the stack trace in the test's log.
		mo.PanicHandler = func(any) fuse.Status { return fuse.EIO }
	}
	srv, err := fuse.NewServerOnFD(raw, fd, initB, mo)
	if err != nil {
		t.Fatalf("NewServerOnFD: %v", err)
	}
	if got, want := srv.NegotiatedFlags(), a.srv.NegotiatedFlags(); got != want {
		t.Errorf("B's negotiated flags %#x, A's %#x", got, want)
	}
	if !o.noResend {
		if st := srv.NotifyResend(); !st.Ok() {
			t.Fatalf("NotifyResend: %v", st)
		}
	}
	b := &hoServer{srv: srv, raw: raw}
	b.serve()
	t.Logf("handover: A stopped in %v, B serving %v after the stop began", stopped, time.Since(start))
	if err := a.srv.Detach(10 * time.Second); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	select {
	case <-a.served:
	case <-time.After(10 * time.Second):
		t.Fatal("A's Serve did not return within 10 s of Detach")
	}
	return b
}

func jsonRoundTrip(t *testing.T, in, out any) {
	t.Helper()
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatalf("encode %T: %v", in, err)
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("decode %T: %v", out, err)
	}
}

// passFD sends a duplicate of srv's fd through a socketpair, as to
// another process, and returns the one received.
func passFD(t *testing.T, srv *fuse.Server) int {
	t.Helper()
	fd, err := srv.DupFD()
	if err != nil {
		t.Fatalf("DupFD: %v", err)
	}
	defer syscall.Close(fd)
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(sp[0])
	defer syscall.Close(sp[1])
	if err := syscall.Sendmsg(sp[0], []byte{0}, syscall.UnixRights(fd), nil, 0); err != nil {
		t.Fatalf("sendmsg: %v", err)
	}
	oob := make([]byte, syscall.CmsgSpace(4))
	_, oobn, _, _, err := syscall.Recvmsg(sp[1], make([]byte, 1), oob, syscall.MSG_CMSG_CLOEXEC)
	if err != nil {
		t.Fatalf("recvmsg: %v", err)
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control message: %v (%d)", err, len(msgs))
	}
	fds, err := syscall.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights: %v (%d)", err, len(fds))
	}
	return fds[0]
}

// client is a process (this binary, re-executed: TestHandoverClient)
// that keeps files open and its cwd on the mount across the handover.
type client struct {
	t       *testing.T
	mnt     string
	cmd     *exec.Cmd
	in      io.WriteCloser
	replies chan string
}

func startClient(t *testing.T, mnt string) *client {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHandoverClient$")
	cmd.Env = append(os.Environ(), "GOFUSE_HANDOVER_CLIENT=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, mnt: mnt, cmd: cmd, in: in, replies: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.replies <- sc.Text()
		}
		close(c.replies)
	}()
	t.Cleanup(func() {
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			connAbort(t, mnt)
			cmd.Process.Kill()
			<-done
			t.Errorf("the client did not exit within 10 s of its stdin closing")
		}
	})
	return c
}

// send writes a command without waiting for its reply.
func (c *client) send(cmd string) {
	c.t.Helper()
	if _, err := fmt.Fprintln(c.in, cmd); err != nil {
		c.t.Fatalf("client %q: %v", cmd, err)
	}
}

// reply waits for the next reply, at most wait; on time-out it aborts
// the connection (so nothing hangs) and fails the test.
func (c *client) reply(what string, wait time.Duration) string {
	c.t.Helper()
	select {
	case r, ok := <-c.replies:
		if !ok {
			c.t.Fatalf("%s: the client exited", what)
		}
		return r
	case <-time.After(wait):
		connAbort(c.t, c.mnt)
		c.t.Fatalf("%s: no reply within %v (connection aborted)", what, wait)
	}
	return ""
}

func (c *client) call(cmd string) string {
	c.t.Helper()
	c.send(cmd)
	return c.reply(cmd, 20*time.Second)
}

// must runs cmd and fails unless it replies "ok ...".
func (c *client) must(cmd string) string {
	c.t.Helper()
	r := c.call(cmd)
	rest, ok := strings.CutPrefix(r, "ok")
	if !ok {
		c.t.Fatalf("client %q: %s", cmd, r)
	}
	return strings.TrimSpace(rest)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return fmt.Sprintf("%d %s", len(b), hex.EncodeToString(s[:]))
}

// TestHandoverClient is the client process; as a test it does nothing.
// Commands, one a line: chdir P, open P (replies the fd), pread FD OFF
// LEN (replies the length and sha256 of the bytes), stat P, readdir FD,
// close FD; each replies "ok ..." or "err ERRNO".
func TestHandoverClient(t *testing.T) {
	if os.Getenv("GOFUSE_HANDOVER_CLIENT") == "" {
		return
	}
	files := map[string]*os.File{}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		reply, err := clientDo(files, f)
		if err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				reply = fmt.Sprintf("err %d %v", int(errno), errno)
			} else {
				reply = "err 0 " + err.Error()
			}
		} else {
			reply = "ok " + reply
		}
		fmt.Println(reply)
	}
	os.Exit(0)
}

func clientDo(files map[string]*os.File, f []string) (string, error) {
	arg := func(i int) int64 {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		return n
	}
	switch f[0] {
	case "chdir":
		return "", os.Chdir(f[1])
	case "open":
		fh, err := os.Open(f[1])
		if err != nil {
			return "", err
		}
		id := strconv.Itoa(int(fh.Fd()))
		files[id] = fh
		return id, nil
	case "pread":
		buf := make([]byte, arg(3))
		n, err := files[f[1]].ReadAt(buf, arg(2))
		if err != nil && err != io.EOF {
			return "", err
		}
		return sum(buf[:n]), nil
	case "stat":
		st, err := os.Stat(f[1])
		if err != nil {
			return "", err
		}
		return strconv.FormatInt(st.Size(), 10), nil
	case "readdir":
		names, err := files[f[1]].Readdirnames(-1)
		if err != nil {
			return "", err
		}
		return strings.Join(names, ","), nil
	case "close":
		err := files[f[1]].Close()
		delete(files, f[1])
		return "", err
	}
	return "", fmt.Errorf("unknown command %q", f[0])
}

// TestHandoverKeepsOpenFilesAndCwd: a descriptor opened before the
// handover reads the same bytes after it, a new open works, the cwd
// still resolves, an open directory still lists, and the mount keeps
// its negotiated flags; all of it again across a second handover.
func TestHandoverKeepsOpenFilesAndCwd(t *testing.T) {
	mnt, a := hoMount(t)
	c := startClient(t, mnt)
	c.must("chdir " + filepath.Join(mnt, "d"))
	fa := c.must("open " + filepath.Join(mnt, "a"))
	dir := c.must("open .")
	if got, want := c.must("pread "+fa+" 0 65536"), sum(hoContent["a"]); got != want {
		t.Fatalf("before: a reads %s, want %s", got, want)
	}

	b := handover(t, mnt, a, handoverOpts{})

	if got, want := c.must("pread "+fa+" 0 65536"), sum(hoContent["a"]); got != want {
		t.Errorf("after: the descriptor opened before reads %s, want a's %s", got, want)
	}
	if got := c.must("stat c"); got != strconv.Itoa(len(hoContent["d/c"])) {
		t.Errorf("stat c in the cwd: size %s", got)
	}
	if got := c.must("readdir " + dir); got != "c" {
		t.Errorf("the directory opened before lists %q, want c", got)
	}
	fb := c.must("open " + filepath.Join(mnt, "b"))
	if got, want := c.must("pread "+fb+" 0 65536"), sum(hoContent["b"]); got != want {
		t.Errorf("a new open of b reads %s, want %s", got, want)
	}
	if got, want := c.must("pread "+fa+" 0 65536"), sum(hoContent["a"]); got != want {
		t.Errorf("after a new open, the old descriptor reads %s, want a's %s", got, want)
	}

	// And on to a third server: A's handles, imported by B, and B's
	// own go across again.
	handover(t, mnt, b, handoverOpts{})
	for fd, key := range map[string]string{fa: "a", fb: "b"} {
		if got, want := c.must("pread "+fd+" 0 65536"), sum(hoContent[key]); got != want {
			t.Errorf("after the second handover, the descriptor of %s reads %s, want %s", key, got, want)
		}
	}
	if got := c.must("stat c"); got != strconv.Itoa(len(hoContent["d/c"])) {
		t.Errorf("after the second handover, stat c in the cwd: size %s", got)
	}
	for _, fd := range []string{fa, fb, dir} {
		c.must("close " + fd)
	}
}

// dropHandle removes the node's handles from the exported table, as if
// the successor could not restore them.
func dropHandle(ino uint64) func(*TableState) {
	return func(st *TableState) {
		node := map[uint64]bool{}
		for _, n := range st.Nodes {
			node[n.NodeID] = n.Ino == ino
		}
		var keep []FileState
		for _, f := range st.Files {
			if !node[f.NodeID] {
				keep = append(keep, f)
			}
		}
		st.Files = keep
	}
}

// TestHandoverUnknownHandleIsStale: a handle the successor does not know
// (its table lacks it) answers ESTALE, also after a new open there,
// never the new file's bytes.
func TestHandoverUnknownHandleIsStale(t *testing.T) {
	mnt, a := hoMount(t)
	c := startClient(t, mnt)
	fa := c.must("open " + filepath.Join(mnt, "a"))
	handover(t, mnt, a, handoverOpts{edit: dropHandle(hoIno["a"])})

	fb := c.must("open " + filepath.Join(mnt, "b"))
	if got, want := c.must("pread "+fb+" 0 65536"), sum(hoContent["b"]); got != want {
		t.Fatalf("b reads %s, want %s", got, want)
	}
	want := fmt.Sprintf("err %d ", int(syscall.ESTALE))
	if got := c.call("pread " + fa + " 0 65536"); !strings.HasPrefix(got, want) {
		t.Errorf("the handle B does not know: %q, want ESTALE (%s)", got, want)
	}
	// Its close (FLUSH, RELEASE) must not reach another handle.
	c.call("close " + fa)
	if got, want := c.must("pread "+fb+" 0 65536"), sum(hoContent["b"]); got != want {
		t.Errorf("after the unknown handle's close, b reads %s, want %s", got, want)
	}
}

// TestHandoverWithoutGuardAliases reproduces what go-fuse did before the
// patch, which TestHandoverUnknownHandleIsStale guards against: with the
// successor's handles restarting at 1, the old descriptor reads the file
// that the new open got, silently.
func TestHandoverWithoutGuardAliases(t *testing.T) {
	mnt, a := hoMount(t)
	c := startClient(t, mnt)
	fa := c.must("open " + filepath.Join(mnt, "a"))
	handover(t, mnt, a, handoverOpts{edit: dropHandle(hoIno["a"]), unguarded: true})

	fb := c.must("open " + filepath.Join(mnt, "b"))
	if got, want := c.must("pread "+fa+" 0 65536"), sum(hoContent["b"]); got != want {
		t.Fatalf("without the guard the old descriptor of a reads %s; the aliasing shows b's %s", got, want)
	}
	c.must("close " + fb)
}

// TestHandoverResendsReadInFlight: a READ that the old server read and
// never answered completes once the successor sends
// FUSE_NOTIFY_RESEND, and not before.
func TestHandoverResendsReadInFlight(t *testing.T) {
	mnt, a := hoMount(t)
	c := startClient(t, mnt)
	fa := c.must("open " + filepath.Join(mnt, "a"))

	b := handover(t, mnt, a, handoverOpts{
		noResend: true,
		beforeB: func() {
			// A is stopped: play the old server that read the
			// READ and died before answering it.
			c.send("pread " + fa + " 0 65536")
			takeRead(t, mnt, a.srv)
		},
	})
	// B serves, but the READ sits in the kernel's processing list,
	// sent and unanswered: nothing comes back.
	select {
	case r := <-c.replies:
		t.Fatalf("the READ the old server took was answered before any resend: %q", r)
	case <-time.After(300 * time.Millisecond):
	}
	if st := b.srv.NotifyResend(); !st.Ok() {
		t.Fatalf("NotifyResend: %v", st)
	}
	r := c.reply("the READ in flight at the handover", 20*time.Second)
	if want := "ok " + sum(hoContent["a"]); r != want {
		t.Errorf("the READ in flight: %q, want %q", r, want)
	}
}

// takeRead reads requests from the connection until a READ, and answers
// none of them.
func takeRead(t *testing.T, mnt string, srv *fuse.Server) {
	t.Helper()
	fd, err := srv.DupFD()
	if err != nil {
		t.Fatalf("DupFD: %v", err)
	}
	defer syscall.Close(fd)
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 2<<20)
		for {
			n, err := syscall.Read(fd, buf)
			if err != nil {
				got <- err
				return
			}
			// fuse_in_header: len, opcode, unique, nodeid...
			if n >= 8 && binary.NativeEndian.Uint32(buf[4:8]) == 15 { // FUSE_READ
				got <- nil
				return
			}
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("reading the connection: %v", err)
		}
	case <-time.After(20 * time.Second):
		connAbort(t, mnt)
		t.Fatal("no READ reached the connection within 20 s (connection aborted)")
	}
}

// TestHandoverStopResume: a server that stopped for a handover that did
// not happen serves again, and a request made while it was stopped
// completes.
func TestHandoverStopResume(t *testing.T) {
	mnt, a := hoMount(t)
	c := startClient(t, mnt)
	fa := c.must("open " + filepath.Join(mnt, "a"))
	if err := a.srv.StopReading(10 * time.Second); err != nil {
		connAbort(t, mnt)
		t.Fatalf("StopReading: %v", err)
	}
	c.send("pread " + fa + " 0 65536")
	select {
	case r := <-c.replies:
		t.Fatalf("a stopped server answered: %q", r)
	case <-time.After(200 * time.Millisecond):
	}
	if err := a.srv.ResumeReading(); err != nil {
		t.Fatalf("ResumeReading: %v", err)
	}
	if r, want := c.reply("the READ made while stopped", 20*time.Second), "ok "+sum(hoContent["a"]); r != want {
		t.Errorf("the READ made while stopped: %q, want %q", r, want)
	}
	if got, want := c.must("pread "+fa+" 0 65536"), sum(hoContent["a"]); got != want {
		t.Errorf("after resuming: %s, want %s", got, want)
	}
	c.must("close " + fa)
}

// TestHandoverStateVersions: a state newer than this build is refused,
// naming the versions.
func TestHandoverStateVersions(t *testing.T) {
	if _, _, err := NewNodeFSFromState(&hoDir{}, nil, &TableState{Version: TableStateVersion + 1}, hoRestorer); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("a newer table state: %v", err)
	}
	st := fuse.InitState{Version: fuse.InitStateVersion + 1}
	if err := st.Check(); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("a newer init state: %v", err)
	}
	if _, err := fuse.NewServerOnFD(nil, -1, fuse.InitState{}, nil); err == nil {
		t.Error("NewServerOnFD took an empty init state")
	}
}
