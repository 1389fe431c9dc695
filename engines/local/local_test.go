package local_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/enginetest"
	"github.com/alkblobfs/alkblobfs/engines/local"
)

func TestEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engines.Engine { return open(t, t.TempDir()) })
}

func open(t *testing.T, dir string) *local.Engine {
	t.Helper()
	e, err := local.Open(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestStaleStageFiles: Open removes what a crash left in the stage
// directory, counts it in one log line, and spares stages that are alive.
func TestStaleStageFiles(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	live := open(t, dir)
	st, err := live.Stage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	v := []byte("a stage that is still being written")
	if _, err := st.Write(v); err != nil {
		t.Fatal(err)
	}
	// What a crashed process leaves: unlocked stage files.
	for i := range 3 {
		if err := os.WriteFile(filepath.Join(dir, "stage", fmt.Sprintf("stage-crashed%d", i)), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	var logs bytes.Buffer
	e, err := local.Open(ctx, dir, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 1 || lines[0]["msg"] != "removed stale stage files" || lines[0]["count"] != 3.0 ||
		lines[0]["in_use"] != 1.0 || lines[0]["dir"] != filepath.Join(dir, "stage") {
		t.Fatalf("Open logged %s; want one line: removed stale stage files, count 3, in_use 1, dir", logs.String())
	}
	if n, err := e.StageResidue(ctx); n != 1 || err != nil {
		t.Fatalf("StageResidue after Open = %d, %v; want 1 (the live stage)", n, err)
	}
	// The live stage was spared and still publishes.
	d := blob.Sum(v)
	if err := st.Commit(ctx, d); err != nil {
		t.Fatalf("Commit of the live stage: %v", err)
	}
	if n, err := e.Size(ctx, d); n != int64(len(v)) || err != nil {
		t.Fatalf("Size = %d, %v", n, err)
	}

	// A clean directory logs nothing.
	logs.Reset()
	if _, err := local.Open(ctx, dir, slog.New(slog.NewJSONHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Fatalf("Open of a clean directory logged %s", logs.String())
	}
}

// TestOpenBesideCommits: a process opening the store (the CLI beside a
// mount, the new daemon of an upgrade) removes only what a crash left: a
// commit in progress elsewhere — its stage file and the checksum sidecar
// it writes into the stage directory before the blob is visible — goes
// through. (The sidecar's temp file was unlocked, so an Open at the wrong
// moment removed it and the commit failed.)
func TestOpenBesideCommits(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	e := open(t, dir)
	stop := make(chan struct{})
	opened := make(chan int)
	go func() {
		n := 0
		defer func() { opened <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := local.Open(ctx, dir, slog.New(slog.DiscardHandler)); err != nil {
				t.Errorf("Open beside commits: %v", err)
				return
			}
			n++
		}
	}()
	const commits = 200
	failed := 0
	for i := range commits {
		v := fmt.Appendf(nil, "blob %d committed while the store is opened", i)
		st, err := e.Stage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write(v); err != nil {
			t.Fatal(err)
		}
		st.(engines.SidecarStage).SetSidecar(bytes.Repeat([]byte{byte(i)}, 64))
		if err := st.Commit(ctx, blob.Sum(v)); err != nil {
			failed++
			t.Logf("commit %d: %v", i, err)
		}
	}
	close(stop)
	n := <-opened
	if failed > 0 {
		t.Fatalf("%d of %d commits failed while another Open ran %d times beside them", failed, commits, n)
	}
	t.Logf("%d commits, %d opens beside them", commits, n)
}

// TestLayout: blobs are read-only files sharded by their first two hex
// digits, and they survive a reopen.
func TestLayout(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	e := open(t, dir)
	v := []byte("layout")
	d := blob.Sum(v)
	put(t, e, d, v)
	p := filepath.Join(dir, "blobs", d.String()[:2], d.String())
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o444 || fi.Size() != int64(len(v)) {
		t.Fatalf("%s: mode %v size %d; want 0444, %d", p, fi.Mode(), fi.Size(), len(v))
	}
	if ok, err := open(t, dir).Has(ctx, d); !ok || err != nil {
		t.Fatalf("Has after reopen = %v, %v", ok, err)
	}
	if e.Root() != dir || e.Name() != "local:"+dir {
		t.Fatalf("Root %q, Name %q", e.Root(), e.Name())
	}
}

// TestForeignFiles: List skips what is not a blob and logs each once.
func TestForeignFiles(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	var logs bytes.Buffer
	e, err := local.Open(ctx, dir, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	v := []byte("real")
	d := blob.Sum(v)
	put(t, e, d, v)
	shard := filepath.Join(dir, "blobs", d.String()[:2])
	other := blob.Sum([]byte("elsewhere"))
	foreign := 0
	for _, name := range []string{
		"README",
		strings.ToUpper(d.String()), // not the canonical spelling
		other.String(),              // a digest name in the wrong shard (unless it shares it)
		d.String()[:2] + "-not-a-digest",
	} {
		if name == other.String() && other.String()[:2] == d.String()[:2] {
			continue
		}
		if err := os.WriteFile(filepath.Join(shard, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		foreign++
	}
	if err := os.Mkdir(filepath.Join(dir, "blobs", "zz"), 0o755); err != nil { // not a shard: never read
		t.Fatal(err)
	}
	for range 2 {
		var got []blob.Digest
		for en, err := range e.List(ctx, blob.Digest{}) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, en.Digest)
		}
		if len(got) != 1 || got[0] != d {
			t.Fatalf("List = %v; want only %s", got, d.Short())
		}
	}
	if n := strings.Count(logs.String(), "skipping foreign file"); n != foreign {
		t.Fatalf("logged %d foreign files over two listings; want %d (once each):\n%s", n, foreign, logs.String())
	}
}

func put(t *testing.T, e *local.Engine, d blob.Digest, v []byte) {
	t.Helper()
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	if _, err := st.Write(v); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(t.Context(), d); err != nil {
		t.Fatal(err)
	}
}

// TestReopen: blobs are durable across a close.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	enginetest.Reopen(t, func(t *testing.T) engines.Engine { return open(t, dir) })
}

// TestPrivateDirs: the store's directories are 0700 whatever existed
// before, so no other user of the host can reach a blob.
func TestPrivateDirs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "large")
	for _, d := range []string{dir, filepath.Join(dir, "blobs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	open(t, dir)
	for _, d := range []string{dir, filepath.Join(dir, "blobs"), filepath.Join(dir, "stage"), filepath.Join(dir, "sums")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s has mode %#o; want 0700", d, fi.Mode().Perm())
		}
	}
}
