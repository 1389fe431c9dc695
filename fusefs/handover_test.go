package fusefs

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestHandoverOptionsAndVersion: a successor whose options fixed at mount
// time differ is refused naming the option; a state in a newer format, or
// without a version, is refused with a message; the current one is read.
func TestHandoverOptionsAndVersion(t *testing.T) {
	fsWith := func(c Config) *FS { return &FS{cfg: c, log: slog.New(slog.DiscardHandler)} }
	f := fsWith(Config{Source: "/srv/blobs"})
	have := f.fixedOptions()
	if err := checkFixed(have, f.fixedOptions()); err != nil {
		t.Fatalf("the same options refused: %v", err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Source: "/srv/blobs", AllowOther: true}, `option --allow-other: the mount has "false" and this build would have "true"`},
		{Config{Source: "/srv/blobs", ReadOnly: true}, `option --read-only: the mount has "false" and this build would have "true"`},
		{Config{Source: "other"}, `option --source: the mount has "/srv/blobs" and this build would have "other"`},
	} {
		g := fsWith(tc.cfg)
		err := checkFixed(have, g.fixedOptions())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	changed := f.fixedOptions()
	changed["max_write"] = "131072"
	if err := checkFixed(changed, have); err == nil || !strings.Contains(err.Error(), "option max_write:") {
		t.Errorf("a different max_write: %v", err)
	}
	older := f.fixedOptions()
	delete(older, "capabilities")
	if err := checkFixed(older, have); err == nil || !strings.Contains(err.Error(), "option capabilities: the mount does not record it") {
		t.Errorf("an option the mount did not record: %v", err)
	}

	state := func(v int) []byte {
		b, err := json.Marshal(handoverState{Version: v, Dir: "/mnt", Table: &gofs.TableState{Version: gofs.TableStateVersion},
			Init: fuse.InitState{Version: fuse.InitStateVersion, KernelMajor: 7, Major: 7, KernelMinor: 41, Minor: 41, MaxWrite: 1 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if st, err := decodeHandover(state(HandoverVersion)); err != nil || st.Dir != "/mnt" {
		t.Fatalf("the current version: %v", err)
	}
	if _, err := decodeHandover(state(HandoverVersion + 1)); err == nil || !strings.Contains(err.Error(), "handover state version 3 is newer than this build reads (2)") {
		t.Errorf("a newer version: %v", err)
	}
	if _, err := decodeHandover(state(0)); err == nil || !strings.Contains(err.Error(), "no version") {
		t.Errorf("no version: %v", err)
	}
}

// TestHandoverFormatVersion: a state with nothing version 2 added (no
// file of incoming/, none of its handles, no --verify=strict check under
// way) is written as version 1, which a build before version 2 reads; any
// of those makes it version 2.
func TestHandoverFormatVersion(t *testing.T) {
	plain := gofs.TableState{
		Nodes: []gofs.NodeState{{Key: keyCtlDir}, {Key: keyNS + "ns"}, {Key: keyIncoming + "ns"}, {Key: keyBlob + "ab/3/0/0"}},
		Files: []gofs.FileState{{Key: keyHandle}, {Key: ""}},
	}
	if v := formatVersion(&plain); v != 1 {
		t.Errorf("a state with nothing of version 2: version %d, want 1", v)
	}
	for _, tc := range []struct {
		node, file string
	}{{node: keyFile + "e30"}, {file: keyFileHandle + "e30"}, {file: keyStrict + "e30"}} {
		tbl := plain
		tbl.Nodes = append(slices.Clone(plain.Nodes), gofs.NodeState{Key: tc.node})
		tbl.Files = append(slices.Clone(plain.Files), gofs.FileState{Key: tc.file})
		if v := formatVersion(&tbl); v != 2 {
			t.Errorf("a state with node key %q, handle key %q: version %d, want 2", tc.node, tc.file, v)
		}
	}
}

// TestRestoredBlobHandle, without a mount: a handle restored in
// passthrough mode whose reader here offers no backing descriptor (a
// store without local files, as a blob not yet verified whole in
// --verify=full) offers go-fuse none, and neither does a later open of
// the same node: never descriptor 0. A --verify=strict handle's
// whole-blob check goes across in its key and goes on from where the
// predecessor's reads left it: intact content passes at the end, a byte
// changed after the handover fails it.
func TestRestoredBlobHandle(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, memSpec.open(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	content := randBytes(3, 1<<20)
	d, pin, err := st.PutBytes(ctx, content)
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	f, err := newFS(Config{Store: st, Namespaces: namespaces.NewMem(nil), Verify: VerifyStrict})
	if err != nil {
		t.Fatal(err)
	}
	b := &blobFile{node: node{fsys: f}, name: d.String(), size: int64(len(content)), large: true}
	offersFd := func(fh gofs.FileHandle) bool {
		p, ok := fh.(gofs.FilePassthroughFder)
		if !ok {
			return false
		}
		_, ok = p.PassthroughFd()
		return ok
	}
	var handles []gofs.FileHandle
	fh, err := b.restoreHandle(ctx, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	handles = append(handles, fh)
	if offersFd(fh) {
		t.Fatal("a restored passthrough handle offers a backing descriptor its reader does not have")
	}
	fh, _, errno := b.Open(ctx, syscall.O_RDONLY)
	if errno != 0 {
		t.Fatal(errno)
	}
	handles = append(handles, fh)
	if offersFd(fh) {
		t.Fatal("an open beside a restored passthrough handle offers a backing descriptor its reader does not have")
	}

	// The strict check, half read by the predecessor.
	half := len(content) / 2
	for _, tc := range []struct {
		name  string
		flip  int // a byte changed in what the successor serves; -1 none
		check func(error) bool
	}{
		{"intact", -1, func(err error) bool { return err == nil }},
		{"changed after the handover", half + 7, func(err error) bool { return errors.Is(err, blob.ErrVerification) }},
	} {
		old := newSeqCheck(d, int64(len(content)))
		if err := old.add(content[:half], 0); err != nil {
			t.Fatal(err)
		}
		// A readahead past the next offset, buffered: it goes along.
		if err := old.add(content[half+4096:half+8192], int64(half+4096)); err != nil {
			t.Fatal(err)
		}
		key, err := fileKey(nil, &blobHandle{seq: old})
		if err != nil || !strings.HasPrefix(key, keyStrict) {
			t.Fatalf("%s: key %q, %v", tc.name, key, err)
		}
		seq, err := parseStrictKey(b, key)
		if err != nil {
			t.Fatal(err)
		}
		fh, err := b.restoreHandle(ctx, false, seq)
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, fh)
		h := fh.(*blobHandle)
		if h.seq == nil {
			t.Fatalf("%s: the restored strict handle has no whole-blob check", tc.name)
		}
		rest := append([]byte(nil), content[half:]...)
		if tc.flip >= 0 {
			rest[tc.flip-half] ^= 1
		}
		var last error
		for off := 0; off < len(rest); off += 4096 {
			if off == 4096 {
				continue // came before the handover
			}
			last = h.seq.add(rest[off:off+4096], int64(half+off))
		}
		if !tc.check(last) {
			t.Errorf("%s: the end of the read: %v", tc.name, last)
		}
	}
	for _, fh := range handles {
		fh.(gofs.FileReleaser).Release(ctx)
	}
	if n := f.stats.openHandles.Load(); n != 0 {
		t.Fatalf("%d handles left open", n)
	}
}

// TestLogLevelsOfAFailedRun: what a failed run's log must show without
// --log-level debug is logged at warning or above: a READ answered with
// any error, and go-fuse's lines about a handover; the ordinary answers
// (a lookup's ENOENT) and go-fuse's request trace stay at debug.
func TestLogLevelsOfAFailedRun(t *testing.T) {
	for _, tc := range []struct {
		op   string
		e    syscall.Errno
		want slog.Level
	}{
		{"read", syscall.EIO, slog.LevelError},
		{"read", syscall.ESTALE, slog.LevelWarn},
		{"read", syscall.EINTR, slog.LevelWarn},
		{"lookup", syscall.EIO, slog.LevelError},
		{"lookup", syscall.ENOENT, slog.LevelDebug},
		{"getxattr", syscall.ENODATA, slog.LevelDebug},
	} {
		if got := errnoLevel(tc.op, tc.e); got != tc.want {
			t.Errorf("%s answered %v: logged at %v, want %v", tc.op, tc.e, got, tc.want)
		}
	}
	for _, tc := range []struct {
		line string
		want slog.Level
	}{
		{"handover: unknown node 12 or file handle 0x100000003: ESTALE", slog.LevelWarn},
		{"stopping: leaving READ unique 88 for the successor", slog.LevelWarn},
		{"NOTIFY_RESEND: operation not permitted", slog.LevelWarn},
		{"fuse: resuming after a stop time-out: fuse: ...", slog.LevelWarn},
		{"rx 12: LOOKUP n1 [\"a\"] 2b", slog.LevelDebug},
		{"tx 12:     OK, {n2 g1 tE=1s tA=1s}", slog.LevelDebug},
	} {
		if got := goFuseLevel(tc.line); got != tc.want {
			t.Errorf("go-fuse's %q: logged at %v, want %v", tc.line, got, tc.want)
		}
	}
}
