package sqlite_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
)

// TestSyncOnlyAfterCommits: the first Sync syncs the WAL; later ones
// touch the disk only if something committed since the last one began.
func TestSyncOnlyAfterCommits(t *testing.T) {
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	ctx := t.Context()
	want := func(n int64, after string) {
		t.Helper()
		if err := e.Sync(ctx); err != nil {
			t.Fatalf("Sync %s: %v", after, err)
		}
		if got := e.Fdatasyncs(); got != n {
			t.Fatalf("after %s: %d fdatasyncs, want %d", after, got, n)
		}
	}
	want(1, "open")
	want(1, "a Sync with nothing committed since")
	if _, err := e.Put(ctx, blob.Sum([]byte("a")), []byte("a")); err != nil {
		t.Fatal(err)
	}
	want(2, "a put")
	want(2, "a Sync with nothing committed since")
}

// TestSyncSeesOtherConnections: a commit on another connection pool of
// the same database (as another process's would be) makes the next Sync
// sync: the WAL is one file whoever wrote it.
func TestSyncSeesOtherConnections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	a, b := open(t, path), open(t, path)
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, blob.Sum([]byte("b")), []byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.Fdatasyncs(); got != 2 {
		t.Fatalf("%d fdatasyncs; want 2: the other pool's commit was not seen", got)
	}
}

// TestSyncConcurrent: writers that each put and Sync share fdatasyncs,
// and every Sync succeeds.
func TestSyncConcurrent(t *testing.T) {
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	const writers, each = 16, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				v := fmt.Appendf(nil, "writer %d put %d", w, i)
				if _, err := e.Put(t.Context(), blob.Sum(v), v); err != nil {
					errs <- err
					return
				}
				if err := e.Sync(t.Context()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := e.Fdatasyncs()
	if n == 0 || n >= writers*each {
		t.Fatalf("%d fdatasyncs for %d Syncs; want at least one, and fewer than one each", n, writers*each)
	}
	t.Logf("%d Syncs, %d fdatasyncs", writers*each, n)
}

func TestSyncAfterClose(t *testing.T) {
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(t.Context()); !errors.Is(err, blob.ErrClosed) {
		t.Fatalf("Sync after Close: %v; want ErrClosed", err)
	}
}
