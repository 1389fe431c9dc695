//go:build linux

package fusefs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/pglo"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// Real mounts: every test mounts a store in t.TempDir() and unmounts in
// t.Cleanup. Without /dev/fuse the tests skip, unless
// ALKBLOBFS_REQUIRE_FUSE=1 (make test) turns the skip into a failure.

// ALKBLOBFS_FUSE_DEBUG=1 traces every FUSE request into the test log (-v).
var debugFUSE = os.Getenv("ALKBLOBFS_FUSE_DEBUG") == "1"

func requireFUSE(t testing.TB) { fusetest.RequireFUSE(t) }

// storeSpec builds a store's engines in dir.
type storeSpec struct {
	name string
	open func(t testing.TB, dir string) store.Config
}

var defaultSpec = storeSpec{"sqlite+local", func(t testing.TB, dir string) store.Config {
	ctx := context.Background()
	kv, err := sqlite.Open(ctx, filepath.Join(dir, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	large, err := local.Open(ctx, filepath.Join(dir, "large"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return store.Config{KV: kv, Large: large}
}}

// storeSpecs are the stores the engine-independent tests run on: the
// embedded default, memory, PostgreSQL (postgres kv + pglo large) when
// scripts/pg.sh provides a server, and SQLite + S3 (s3_test.go) when
// scripts/s3.sh does (make test requires both).
var storeSpecs = []storeSpec{defaultSpec, memSpec, pgSpec, s3Spec}

var pgSpec = storeSpec{"postgres+pglo", func(t testing.TB, dir string) store.Config {
	return pgConfig(t, pgtest.DSN(t), dir)
}}

func pgConfig(t testing.TB, dsn, dir string) store.Config {
	ctx := context.Background()
	kv, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	large, err := pglo.Open(ctx, dsn)
	if err != nil {
		kv.Close()
		t.Fatal(err)
	}
	return store.Config{KV: kv, Large: large, ScratchDir: dir}
}

var memSpec = storeSpec{"mem", func(t testing.TB, dir string) store.Config {
	return store.Config{KV: mem.New(), Large: mem.New(), ScratchDir: dir}
}}

// env is one mounted store.
type env struct {
	t    testing.TB
	mnt  string
	data string
	st   *store.Store
	// The engines under st, for what a test checks around the store
	// (stage residue, a swept object).
	kv    engines.KV
	large engines.Large
	reg   namespaces.Registry
	srv   *Server
	logs  *logBuffer
}

type mountOpt func(*Config)

// unmountWait bounds a harness's unmount: past it, the test left a file
// open (or the mount hung), and the harness gives up.
const unmountWait = 30 * time.Second

func withVerify(v Verify) mountOpt            { return func(c *Config) { c.Verify = v } }
func withReceiptTTL(d time.Duration) mountOpt { return func(c *Config) { c.ReceiptTTL = d } }
func withMaxReceipts(n int) mountOpt          { return func(c *Config) { c.MaxReceipts = n } }

// mountStore mounts a fresh store built by spec.
func mountStore(t testing.TB, spec storeSpec, opts ...mountOpt) *env {
	t.Helper()
	requireFUSE(t)
	data := t.TempDir()
	return mountOn(t, data, spec.open(t, data), opts...)
}

// mountOn mounts the store of cfg (whose engines live under data).
func mountOn(t testing.TB, data string, cfg store.Config, opts ...mountOpt) *env {
	t.Helper()
	requireFUSE(t)
	ctx := context.Background()
	logs := &logBuffer{}
	lvl := slog.LevelInfo
	if debugFUSE {
		lvl = slog.LevelDebug
	}
	lg := slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: lvl}))
	cfg.Logger = lg
	st, err := store.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := namespaces.Open(ctx, cfg.KV, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := st.Register(reg)
	c := Config{Store: st, Namespaces: reg, Logger: lg, Debug: debugFUSE}
	for _, o := range opts {
		o(&c)
	}
	mnt := t.TempDir()
	srv, err := Mount(mnt, c)
	if err != nil {
		st.Close()
		t.Fatalf("mount: %v", err)
	}
	conn, err := fusetest.Conn(srv.Dir())
	if err != nil {
		srv.Unmount()
		st.Close()
		t.Fatalf("the new mount's FUSE connection: %v", err)
	}
	e := &env{t: t, mnt: mnt, data: data, st: st, kv: cfg.KV, large: cfg.Large, reg: reg, srv: srv, logs: logs}
	t.Cleanup(func() {
		// A test that failed with a file open would leave a lazy unmount
		// waiting for it forever, and the binary hung at exit: give up
		// after a while, aborting the connection.
		if !fusetest.Unmount(t, srv.Dir(), conn, unmountWait, srv.Unmount) {
			return
		}
		h.Deregister()
		st.Close()
		if strings.Contains(logs.String(), panicLog) {
			t.Errorf("a FUSE request panicked (see the log)")
		}
	})
	return e
}

func (e *env) path(p ...string) string { return filepath.Join(append([]string{e.mnt}, p...)...) }

// mkns makes a namespace through the mount.
func (e *env) mkns(name string) string {
	e.t.Helper()
	if err := os.Mkdir(e.path(name), 0o755); err != nil {
		e.t.Fatal(err)
	}
	return e.path(name)
}

// fill stores n distinct small blobs and links them into ns in one
// batch, without going through the mount; it returns their digests.
func (e *env) fill(ns string, n int) []blob.Digest {
	e.t.Helper()
	ctx := context.Background()
	ds := make([]blob.Digest, 0, n)
	for i := range n {
		d, pin, err := e.st.PutBytes(ctx, fmt.Appendf(nil, "blob %d", i))
		if err != nil {
			e.t.Fatal(err)
		}
		pin.Release()
		ds = append(ds, d)
	}
	if _, err := e.reg.LinkMany(ctx, ns, ds); err != nil {
		e.t.Fatal(err)
	}
	return ds
}

// put stores b and links it into ns without going through the mount.
func (e *env) put(ns string, b []byte) blob.Digest {
	e.t.Helper()
	ctx := context.Background()
	d, pin, err := e.st.Put(ctx, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		e.t.Fatal(err)
	}
	defer pin.Release()
	if _, err := e.reg.Link(ctx, ns, d); err != nil {
		e.t.Fatal(err)
	}
	return d
}

// listNS lists a namespace's digests through the mount (incoming/ aside).
func (e *env) listNS(t testing.TB, ns string) []string {
	t.Helper()
	ents, err := os.ReadDir(e.path(ns))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range ents {
		if de.Name() != incomingName {
			out = append(out, de.Name())
		}
	}
	return out
}

// expectNS checks that ns lists exactly want and that every file's sha256
// is its name.
func (e *env) expectNS(t testing.TB, ns string, want []string) {
	t.Helper()
	got := e.listNS(t, ns)
	want = slices.Clone(want)
	slices.Sort(want)
	want = slices.Compact(want)
	if !slices.Equal(got, want) {
		t.Fatalf("namespace %s lists\n  %v\nwant\n  %v", ns, short(got), short(want))
	}
	for _, name := range got {
		if sum := fileSum(t, e.path(ns, name)); sum != name {
			t.Fatalf("%s/%s: sha256 is %s", ns, name, sum)
		}
	}
}

func short(ds []string) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d[:min(12, len(d))]
	}
	return out
}

// run runs a command, failing the test on a non-zero exit.
// run runs name with args in dir ("" for the current directory). The
// chdir happens in a shell after exec, never in the forked child: dir may
// be inside a mount this process serves, and a child chdir'ing there
// before exec hung the suite once (its FUSE_ACCESS request waited on a
// server that waited on it).
func run(t testing.TB, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	if dir != "" {
		cmd = exec.Command("sh", append([]string{"-c", `cd "$0" && exec "$@"`, dir, name}, args...)...)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func sh(t testing.TB, script string) string {
	t.Helper()
	return run(t, "", "bash", "-ec", script)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func fileSum(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// randBytes is deterministic pseudo-random content.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// eventually is fusetest.Eventually.
var eventually = fusetest.Eventually

// logBuffer keeps the mount's log for assertions.
type logBuffer = fusetest.Buffer

// testWriter shows the mount's log in the test's output under -v (go
// test -json sets it). Not for a fuzz test's mount: its log lines come
// from inside the fuzz target, where F.Logf panics, and a panic in a
// request handler of the test's own mount ends the process while a
// thread of it waits in write(2) on that mount: a zombie that never
// exits, and go test waits for it forever.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if _, fuzz := w.t.(*testing.F); testing.Verbose() && !fuzz {
		w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

// stageResidue counts stage files of a local large tier.
func stageResidue(t testing.TB, large engines.Large) int {
	t.Helper()
	rc, ok := large.(engines.ResidueCounter)
	if !ok {
		return 0
	}
	n, err := rc.StageResidue(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}
