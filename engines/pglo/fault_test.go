package pglo_test

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// TestServerRestart restarts the server under an open stage, an open
// cursor and a loop of puts and reads. What was in flight fails with an
// error naming the engine; nothing half-written is visible and no object
// is orphaned; and the very next operations, on the same engine, succeed:
// the pool drops its dead connections instead of failing on each in turn.
func TestServerRestart(t *testing.T) {
	f := pgtest.FaultServer(t)
	e := open(t, f.DSN)
	t.Cleanup(func() { e.Close() })
	ctx := t.Context()

	old := randBytes(3*chunk + 1000)
	od := commit(t, e, old)
	cur, err := e.Open(ctx, od)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	readBack(t, cur, old)

	// A stage with its transaction open on the server.
	st, err := e.Stage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	half := randBytes(2 * chunk)
	if _, err := st.Write(half); err != nil {
		t.Fatal(err)
	}

	// Idle pooled connections, all of which the restart kills (more than
	// the loop below can use up).
	pgtest.Warm(t, e.Pool(), 8)

	// A loop of puts running across the restart.
	var stop atomic.Bool
	var loopErrs []error
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			v := randBytes(chunk + i)
			if err := tryCommit(e, v); err != nil {
				loopErrs = append(loopErrs, err)
			}
		}
	})

	f.Restart(t)
	stop.Store(true)
	wg.Wait()
	t.Logf("%d loop operations failed across the restart", len(loopErrs))
	for _, err := range loopErrs {
		if !strings.Contains(err.Error(), e.Name()) {
			t.Errorf("loop error does not name the engine: %v", err)
		}
	}

	// The stage's transaction died with its session.
	_, werr := st.Write(randBytes(chunk))
	cerr := st.Commit(ctx, blob.Sum(half))
	if werr == nil && cerr == nil {
		t.Fatal("a stage whose transaction was cut by a restart committed")
	}
	t.Logf("in-flight stage: write: %v; commit: %v", werr, cerr)
	if err := cmp.Or(werr, cerr); !strings.Contains(err.Error(), e.Name()) {
		t.Errorf("stage error does not name the engine: %v", err)
	}

	// The next operations succeed at once, on the same engine and cursor.
	readBack(t, cur, old)
	if ok, err := e.Has(ctx, blob.Sum(half)); ok || err != nil {
		t.Fatalf("Has(half-written stage) = %v, %v; want false, nil", ok, err)
	}
	v := randBytes(chunk + 7)
	d := commit(t, e, v)
	readAll(t, e, d, v)
	if n := residue(t, e); n != 0 {
		t.Fatalf("StageResidue after the restart = %d; want 0", n)
	}
	for en, err := range e.List(ctx, blob.Digest{}) {
		if err != nil {
			t.Fatal(err)
		}
		if en.Digest == blob.Sum(half) {
			t.Fatal("the cut stage is listed")
		}
	}
}

// TestServerDown: with the server stopped, operations fail with an error
// naming the server's address; once it is back, the same engine works.
func TestServerDown(t *testing.T) {
	f := pgtest.FaultServer(t)
	e := open(t, f.DSN)
	t.Cleanup(func() { e.Close() })
	v := randBytes(1000)
	d := commit(t, e, v)

	pgtest.Warm(t, e.Pool(), 4)
	f.Stop(t)
	_, err := e.Size(t.Context(), d)
	if err == nil {
		t.Fatal("Size with the server down succeeded")
	}
	t.Logf("server down: %v", err)
	if addr := e.Server().Addr(); !strings.Contains(err.Error(), addr) {
		t.Errorf("error does not name %s: %v", addr, err)
	}
	if errors.Is(err, blob.ErrMissing) {
		t.Errorf("a down server reads as a missing blob: %v", err)
	}
	if err := tryCommit(e, randBytes(2000)); err == nil {
		t.Fatal("a put with the server down succeeded")
	}

	f.Start(t)
	readAll(t, e, d, v)
	commit(t, e, randBytes(3000))
}

func readBack(t *testing.T, c engines.Cursor, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	// Small reads, as a mount does: several per window.
	for off := 0; off < len(want); off += 100 << 10 {
		n, err := c.ReadAt(got[off:min(off+100<<10, len(want))], int64(off))
		if err != nil && err != io.EOF {
			t.Fatalf("ReadAt(%d): %v", off, err)
		}
		if n != min(100<<10, len(want)-off) {
			t.Fatalf("ReadAt(%d) = %d bytes", off, n)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("cursor read back other bytes")
	}
}
