// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// nodeIDOf returns the node id raw's table gives the node with inode
// number ino, 0 if none.
func nodeIDOf(raw fuse.RawFileSystem, ino uint64) uint64 {
	t := &raw.(*rawBridge).ids
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.nodes {
		if e.inode.Load().stableAttr.Ino == ino {
			return id
		}
	}
	return 0
}

// TestHandoverResumeAfterSuccessorServedNeverAliases: B serves (the
// kernel caches b under a node id B chose, for an hour), then fails; A
// resumes. A must not hand out B's node ids again: the kernel would
// take a's node for its cached b, and `open b` would read a's bytes.
// b's cached id is unknown to A, so it may answer ESTALE; never a's
// data.
func TestHandoverResumeAfterSuccessorServedNeverAliases(t *testing.T) {
	mnt, a := hoMount(t)
	// hoMount's A does not cache; this test needs the kernel to
	// keep B's entries, so it mounts its own A.
	a.srv.Unmount()
	hour := time.Hour
	opts := &Options{EntryTimeout: &hour, AttrTimeout: &hour}
	rawA := NewNodeFS(&hoDir{}, opts)
	srvA, err := fuse.NewServer(rawA, mnt, hoMountOptions())
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	a = &hoServer{srv: srvA, raw: rawA}
	a.serve()
	if err := srvA.WaitMount(); err != nil {
		t.Fatalf("WaitMount: %v", err)
	}
	c := startClient(t, mnt)

	if err := srvA.StopReading(10 * time.Second); err != nil {
		connAbort(t, mnt)
		t.Fatalf("StopReading: %v", err)
	}
	table, err := ExportState(rawA, hoNodeKey, hoFileKey)
	if err != nil {
		t.Fatalf("ExportState: %v", err)
	}
	fd := passFD(t, srvA)
	rawB, _, err := NewNodeFSFromState(&hoDir{}, opts, table, hoRestorer)
	if err != nil {
		t.Fatalf("NewNodeFSFromState: %v", err)
	}
	srvB, err := fuse.NewServerOnFD(rawB, fd, srvA.InitState(), hoMountOptions())
	if err != nil {
		t.Fatalf("NewServerOnFD: %v", err)
	}
	if st := srvB.NotifyResend(); !st.Ok() {
		t.Fatalf("NotifyResend: %v", st)
	}
	b := &hoServer{srv: srvB, raw: rawB}
	b.serve()
	c.must("stat " + filepath.Join(mnt, "b"))
	idB := nodeIDOf(rawB, hoIno["b"])

	// B fails: it stops and goes away; A takes the connection back.
	if err := srvB.StopReading(10 * time.Second); err != nil {
		connAbort(t, mnt)
		t.Fatalf("B StopReading: %v", err)
	}
	if err := srvB.Detach(10 * time.Second); err != nil {
		t.Fatalf("B Detach: %v", err)
	}
	if err := srvA.ResumeReading(); err != nil {
		t.Fatalf("ResumeReading: %v", err)
	}
	c.must("stat " + filepath.Join(mnt, "a"))
	c.must("stat " + filepath.Join(mnt, "d/c"))
	for _, k := range []string{"a", "d/c"} {
		if id := nodeIDOf(rawA, hoIno[k]); id == idB {
			t.Errorf("A gave %s node id %d after resuming, which B had given b", k, id)
		}
	}

	r := c.call("open " + filepath.Join(mnt, "b"))
	fb, opened := strings.CutPrefix(r, "ok ")
	if !opened {
		// ESTALE for the id A does not know: the guard held.
		t.Logf("open b after resuming: %s", r)
		return
	}
	if got, want := c.must("pread "+fb+" 0 65536"), sum(hoContent["b"]); got != want {
		t.Errorf("open b after resuming reads %s, want b's %s (a's is %s)", got, want, sum(hoContent["a"]))
	}
	c.must("close " + fb)
}

// anyNameRoot answers every lookup with a file, the reserved wake-up
// name included.
type anyNameRoot struct{ Inode }

func (r *anyNameRoot) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*Inode, syscall.Errno) {
	return r.NewInode(ctx, &MemRegularFile{Data: []byte(name)}, StableAttr{Mode: syscall.S_IFREG}), 0
}

// TestHandoverReservedNameOnPlainMount: a mount that never stops
// serves the name StopReading uses for its wake-ups like any other.
func TestHandoverReservedNameOnPlainMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	mnt := t.TempDir()
	srv, err := fuse.NewServer(NewNodeFS(&anyNameRoot{}, nil), mnt, hoMountOptions())
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		t.Fatalf("WaitMount: %v", err)
	}
	defer srv.Unmount()
	for _, name := range []string{"other", ".go-fuse-handover-wake"} {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(mnt, name), &st); err != nil {
			t.Errorf("stat %s on a plain mount: %v", name, err)
		}
	}
}

// slowReadRoot's files count their READs; the first blocks until
// release is closed.
type slowReadRoot struct {
	Inode
	reads   *atomic.Int32
	release chan struct{}
}

type slowReadFile struct {
	Inode
	root *slowReadRoot
}

func (r *slowReadRoot) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*Inode, syscall.Errno) {
	out.Mode = 0644
	return r.NewInode(ctx, &slowReadFile{root: r}, StableAttr{Mode: syscall.S_IFREG, Ino: 77}), 0
}

func (f *slowReadFile) Open(ctx context.Context, flags uint32) (FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *slowReadFile) Read(ctx context.Context, fh FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.root.reads.Add(1) == 1 {
		<-f.root.release
	}
	return fuse.ReadResultData([]byte("hello")), 0
}

// TestHandoverStopTimeoutRunsHandlerOnce: a StopReading that times out
// while a READ is in its handler must not have the kernel resend that
// READ while it runs: the handler would run twice.
func TestHandoverStopTimeoutRunsHandlerOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	mnt := t.TempDir()
	root := &slowReadRoot{reads: &atomic.Int32{}, release: make(chan struct{})}
	srv, err := fuse.NewServer(NewNodeFS(root, hoOptions()), mnt, hoMountOptions())
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		t.Fatalf("WaitMount: %v", err)
	}
	defer syscall.Unmount(mnt, syscall.MNT_DETACH)
	if !srv.SupportsResend() {
		t.Skip("the kernel does not offer FUSE_HAS_RESEND")
	}
	c := startClient(t, mnt)
	fd := c.must("open " + filepath.Join(mnt, "x"))
	c.send("pread " + fd + " 0 5")
	waitFor(t, "the first READ in its handler", func() bool { return root.reads.Load() == 1 })

	if err := srv.StopReading(100 * time.Millisecond); !errors.Is(err, fuse.ErrStopTimeout) {
		close(root.release)
		connAbort(t, mnt)
		t.Fatalf("StopReading with a READ blocked in its handler: %v, want ErrStopTimeout", err)
	}
	if err := srv.ResumeReading(); err == nil {
		t.Errorf("ResumeReading after a stop that timed out (and resumes by itself) succeeded")
	}
	close(root.release)
	if r, want := c.reply("the slow pread", 20*time.Second), "ok "; !strings.HasPrefix(r, want) {
		t.Errorf("the slow pread: %q", r)
	}
	// The server reads again once the slow handler is done; this
	// READ is queued after anything the resend queued again.
	c.must("pread " + fd + " 0 5")
	if n := root.reads.Load(); n != 2 {
		t.Errorf("two preads ran the Read handler %d times", n)
	}
	c.must("close " + fd)
}

// TestHandoverWaitOutlivesStop: Wait returns when Serve does, not when
// StopReading parks the readers; Unmount of a stopped server is
// refused; a second Detach and a ResumeReading after Detach fail
// rather than block.
func TestHandoverWaitOutlivesStop(t *testing.T) {
	mnt, a := hoMount(t)
	waited := make(chan struct{})
	go func() {
		a.srv.Wait()
		close(waited)
	}()
	if err := a.srv.StopReading(10 * time.Second); err != nil {
		connAbort(t, mnt)
		t.Fatalf("StopReading: %v", err)
	}
	if err := a.srv.Unmount(); err == nil {
		t.Errorf("Unmount of a stopped server succeeded")
	}
	if err := a.srv.ResumeReading(); err != nil {
		t.Fatalf("ResumeReading: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(mnt, "a"), &st); err != nil {
		t.Fatalf("stat after resuming: %v", err)
	}
	select {
	case <-waited:
		t.Fatalf("Wait returned on StopReading, while the mount is served")
	default:
	}

	if err := a.srv.StopReading(10 * time.Second); err != nil {
		connAbort(t, mnt)
		t.Fatalf("second StopReading: %v", err)
	}
	if err := a.srv.Detach(10 * time.Second); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if err := a.srv.Detach(10 * time.Second); err == nil {
		t.Errorf("a second Detach succeeded")
	}
	resumed := make(chan error, 1)
	go func() { resumed <- a.srv.ResumeReading() }()
	select {
	case err := <-resumed:
		if err == nil {
			t.Errorf("ResumeReading after Detach succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("ResumeReading after Detach blocked for 10 s")
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatalf("Wait did not return within 10 s of Detach")
	}
}

// waitFor polls cond every millisecond for at most 10 s, failing the
// test with what it waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
