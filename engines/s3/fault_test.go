package s3_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/s3"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// TestServerDown stops the server under an open cursor, a stage with
// parts uploaded and a loop of puts. Every operation fails with an error
// naming the key (not ErrMissing), nothing half-written becomes visible,
// and once the server is back the same engine and cursor work; what the
// failed stage could not abort while the server was down is removed by
// the next Open's cleanup.
func TestServerDown(t *testing.T) {
	f := s3test.FaultServer(t)
	e := open(t, f.URL, smallParts)
	t.Cleanup(func() { e.Close() })
	ctx := t.Context()

	old := randBytes(3<<20 + 1000)
	od := commitOdd(t, e, old)
	cur, err := e.Open(ctx, od)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()

	st, err := e.Stage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	half := randBytes(2*part + 10)
	if _, err := st.Write(half); err != nil { // two parts: an upload is open
		t.Fatal(err)
	}

	// A loop of puts running across the stop.
	var stop sync.WaitGroup
	quit := make(chan struct{})
	var loopErrs []error
	stop.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			default:
			}
			if err := tryCommit(e, randBytes(1000+i)); err != nil {
				loopErrs = append(loopErrs, err)
			}
		}
	})

	f.Stop(t)
	start := time.Now()
	_, err = e.Size(ctx, od)
	t.Logf("Size with the server down, after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil || errors.Is(err, blob.ErrMissing) || !strings.Contains(err.Error(), e.Key(od)) || !strings.Contains(err.Error(), "attempts") {
		t.Fatalf("Size with the server down: %v; want an error naming the key and the attempts, not ErrMissing", err)
	}
	if _, err := cur.ReadAt(make([]byte, 100), 2<<20); err == nil || errors.Is(err, blob.ErrMissing) {
		t.Fatalf("ReadAt with the server down: %v; want an error, not ErrMissing", err)
	}
	if ok, err := e.Has(ctx, od); err == nil {
		t.Fatalf("Has with the server down = %v, nil; want an error", ok)
	}
	if _, err := st.Write(randBytes(part)); err == nil {
		err = st.Commit(ctx, blob.Sum(half))
		if err == nil {
			t.Fatal("a stage committed with the server down")
		}
	}
	close(quit)
	stop.Wait()
	t.Logf("%d loop puts failed while the server was down", len(loopErrs))
	for _, err := range loopErrs {
		if !strings.Contains(err.Error(), e.Name()) {
			t.Errorf("loop error does not name the engine: %v", err)
		}
	}

	f.Start(t)
	readBack(t, cur, old)
	if ok, err := e.Has(ctx, blob.Sum(half)); ok || err != nil {
		t.Fatalf("Has(the cut stage) = %v, %v; want false, nil", ok, err)
	}
	v := randBytes(part + 7)
	readAll(t, e, commitOdd(t, e, v), v)
	for en, err := range e.List(ctx, blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		if en.Digest == blob.Sum(half) {
			t.Fatal("the cut stage is listed")
		}
	}
	// The cut stage's upload could not be aborted while the server was
	// down; it stays until an Open finds it stale.
	n, err := e.StageResidue(ctx)
	t.Logf("StageResidue after the restart: %d", n)
	if err != nil {
		t.Fatal(err)
	}
	e2 := open(t, f.URL, func(c *s3.Config) { c.StaleAfter = time.Nanosecond })
	defer e2.Close()
	checkNoResidue(t, e2)
}

// TestKilledUpload: a process killed in the middle of a multipart upload
// leaves no visible object; its parts stay, counted as residue, until an
// Open finds them stale, removes them and logs it.
func TestKilledUpload(t *testing.T) {
	if url := os.Getenv("S3TEST_KILLED_UPLOAD"); url != "" {
		killedUploadChild(t, url)
		return
	}
	u := s3test.URL(t)
	v := randBytes(3*part + 100)
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledUpload$", "-test.v")
	cmd.Env = append(os.Environ(), "S3TEST_KILLED_UPLOAD="+u)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "PARTS UPLOADED") {
				ready <- nil
				return
			}
		}
		ready <- fmt.Errorf("child ended without uploading: %v", sc.Err())
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("child did not upload its parts within a minute")
	}
	cmd.Process.Kill() // SIGKILL: no Discard, no abort
	cmd.Wait()

	e := open(t, u, nil) // stale after a day: the upload stays
	defer e.Close()
	ctx := t.Context()
	if ok, err := e.Has(ctx, blob.Sum(v)); ok || err != nil {
		t.Fatalf("Has after the kill = %v, %v", ok, err)
	}
	for en, err := range e.List(ctx, blob.Digest{}) {
		t.Fatalf("listed %v, %v after a killed upload; want nothing", en, err)
	}
	if n, err := e.StageResidue(ctx); n != 1 || err != nil {
		t.Fatalf("StageResidue after the kill = %d, %v; want 1 (the upload)", n, err)
	}

	var logs bytes.Buffer
	e2 := open(t, u, func(c *s3.Config) { c.StaleAfter = time.Nanosecond }, slog.New(slog.NewTextHandler(&logs, nil)))
	defer e2.Close()
	t.Logf("log: %s", logs.String())
	if !strings.Contains(logs.String(), "removed stale") || !strings.Contains(logs.String(), "uploads=1") {
		t.Fatalf("Open removed nothing, or did not say so: log %q", logs.String())
	}
	checkNoResidue(t, e2)
	if n := count(t, e2, ""); n != 0 {
		t.Fatalf("%d objects under the prefix after the cleanup", n)
	}
}

// killedUploadChild stages 3 parts and a bit, says so, and waits to be
// killed.
func killedUploadChild(t *testing.T, url string) {
	e := open(t, url, smallParts)
	st, err := e.Stage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(randBytes(3*part + 100)); err != nil {
		t.Fatal(err)
	}
	// The third part uploads in the background; wait until the server
	// has the first two at least.
	time.Sleep(500 * time.Millisecond)
	fmt.Println("PARTS UPLOADED")
	time.Sleep(time.Minute)
	t.Fatal("not killed")
}

func readBack(t *testing.T, c interface {
	ReadAt([]byte, int64) (int, error)
}, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 100 << 10 {
		k := min(100<<10, len(want)-off)
		n, err := c.ReadAt(got[off:off+k], int64(off))
		if n != k {
			t.Fatalf("ReadAt(%d) = %d, %v", off, n, err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("cursor read back other bytes")
	}
}
