//go:build linux

package fusefs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/s3"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/store"
)

// s3Spec is SQLite for the kv tier and S3 for the large one, on a fresh
// prefix of the server scripts/s3.sh starts (make test requires one).
var s3Spec = storeSpec{"sqlite+s3", func(t testing.TB, dir string) store.Config {
	return s3Config(t, s3test.URL(t), dir)
}}

func s3Config(t testing.TB, url, dir string) store.Config {
	ctx := context.Background()
	large, err := s3.OpenURL(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := sqlite.Open(ctx, filepath.Join(dir, "kv.db"))
	if err != nil {
		large.Close()
		t.Fatal(err)
	}
	return store.Config{KV: kv, Large: large, ScratchDir: dir}
}

// TestS3Outage: while the S3 server is down, a mount on sqlite+s3 answers
// EIO for reads and publishes of large blobs, with a log line naming the
// key, and publishes nothing half written; once the server is back, the
// same mount works again.
func TestS3Outage(t *testing.T) {
	requireFUSE(t)
	srv := s3test.FaultServer(t)
	data := t.TempDir()
	cfg := s3Config(t, srv.URL, data)
	large := cfg.Large.(*s3.Engine)
	e := mountOn(t, data, cfg)
	e.mkns("p")
	a, b := randBytes(51, 300<<10), randBytes(52, 3<<20)
	da, db := e.put("p", a), e.put("p", b)

	srv.Stop(t)
	for _, d := range []blob.Digest{da, db} {
		_, err := os.ReadFile(e.path("p", d.String()))
		wantErrno(t, "read during the outage", err, syscall.EIO)
	}
	if !strings.Contains(e.logs.String(), large.Key(da)) && !strings.Contains(e.logs.String(), large.Key(db)) {
		t.Errorf("no log line naming the key:\n%s", e.logs.String())
	}
	down := randBytes(53, 1<<20)
	err := os.WriteFile(e.path("p", "incoming", "down.bin"), down, 0o644)
	wantErrno(t, "publish during the outage", err, syscall.EIO)

	srv.Start(t)
	for _, d := range []blob.Digest{da, db} {
		got, err := os.ReadFile(e.path("p", d.String()))
		if err != nil || sum(got) != d.String() {
			t.Fatalf("read after the server came back: %v", err)
		}
	}
	if ok, err := large.Has(context.Background(), blob.Sum(down)); ok || err != nil {
		t.Fatalf("the publish cut by the outage: Has = %v, %v; want false, nil", ok, err)
	}
	fresh := randBytes(54, 2<<20)
	writeFile(t, filepath.Join(e.path("p", "incoming"), "up.bin"), fresh)
	e.expectNS(t, "p", []string{da.String(), db.String(), sum(fresh)})
}

// TestS3Fleet: two mounts, one store (PostgreSQL kv, S3 large tier, fleet
// mode, no --shared-media): a file written on A is readable on B; a file
// open on B survives A removing it and sweeping; once B closes it (and its
// pin row expires), A's sweeps remove the blob from the bucket.
func TestS3Fleet(t *testing.T) {
	requireFUSE(t)
	dsn, url := pgtest.DSN(t), s3test.URL(t)
	mount := func() *env {
		data := t.TempDir()
		cfg := pgConfig(t, dsn, data)
		cfg.Large.Close() // pglo: replaced by S3
		large, err := s3.OpenURL(context.Background(), url, nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Large, cfg.Fleet = large, true
		// A released pin's row goes at its owner's next arbitration, or
		// when it expires: short rows let A's sweeps see B's close soon.
		cfg.PinTTL = time.Second
		return mountOn(t, data, cfg)
	}
	a, b := mount(), mount()
	ctx := context.Background()

	a.mkns("f")
	content := randBytes(61, 5<<20+77) // a multipart upload
	receipt := filepath.Join(a.path("f", "incoming"), "big.bin")
	writeFile(t, receipt, content)
	d := sum(content)
	// The receipt (the incoming name, readable after publish) pins the
	// blob on A; only B's open file should keep it below.
	if err := os.Remove(receipt); err != nil {
		t.Fatal(err)
	}
	var f *os.File
	eventually(t, 10*time.Second, "B to see A's file", func() bool {
		var err error
		f, err = os.Open(b.path("f", d))
		return err == nil
	})
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatalf("B reads A's file: %v", err)
	}

	sweep := func(e *env) {
		t.Helper()
		if err := writeCtl(e.path(controlName, "sweep"), "run"); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(a.path("f", d)); err != nil {
		t.Fatal(err)
	}
	sweep(a)
	sweep(a)
	dg := blob.MustParse(d)
	if ok, err := a.st.Has(ctx, dg); !ok || err != nil {
		t.Fatalf("A's sweeps removed a blob open on B: Has = %v, %v", ok, err)
	}
	rest, err := io.ReadAll(f)
	if err != nil || sum(append(head, rest...)) != d {
		t.Fatalf("B's read after A's sweeps: %v", err)
	}
	f.Close()
	eventually(t, 30*time.Second, "B's handle's release", func() bool {
		return b.srv.Stats(ctx).OpenHandles == 0
	})
	eventually(t, 10*time.Second, "A's sweeps to remove the blob B closed", func() bool {
		sweep(a)
		sweep(a)
		ok, _ := a.st.Has(ctx, dg)
		return !ok
	})
	if ok, err := b.large.Has(ctx, dg); ok || err != nil {
		t.Fatalf("the bucket still has the swept blob: %v, %v", ok, err)
	}
}
