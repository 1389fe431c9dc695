package store_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
	"github.com/alkblobfs/alkblobfs/meta/metatest"
	"github.com/alkblobfs/alkblobfs/store"
)

// rerunHost is the SQLite engine whose next kv arbitration the Batcher
// runs the way it does when SQLite ends a shared transaction: first in a
// transaction where another writer's job came before it (and removed the
// link of unlink), then a later job ends that transaction (SQLite does
// on a full disk: everything in it rolls back), and the arbitration runs
// again alone — where the link is back, the other job's own run alone
// having failed too (the disk is still full).
type rerunHost struct {
	*sqlite.Engine
	t       *testing.T
	armed   atomic.Bool
	unlink  []blob.Digest
	unlinks atomic.Int32 // runs of the other writer's job
}

// Meta is the engine's state with the host's Arbitrate rerun.
func (h *rerunHost) Meta() meta.State {
	st := h.Engine.Meta()
	st.Host = rerunArb{Host: st.Host, h: h}
	return st
}

type rerunArb struct {
	meta.Host
	h *rerunHost
}

var errFull = errors.New("test: the disk is still full")

func (a rerunArb) Arbitrate(ctx context.Context, arb meta.Arbitration) ([]int64, error) {
	h := a.h
	if arb.Outside != nil || !h.armed.CompareAndSwap(true, false) {
		return a.Host.Arbitrate(ctx, arb)
	}
	b := h.Batcher()
	queued := func(n int) {
		for deadline := time.Now().Add(time.Minute); b.Queued() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				h.t.Errorf("the Batcher holds %d queued jobs after a minute, want %d", b.Queued(), n)
				return
			}
		}
	}
	// Hold the Batcher's loop, so that the three jobs below share its next
	// transaction, in queue order.
	release, err := metatest.HoldWriter(ctx, b)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		b.Do(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
			if h.unlinks.Add(1) > 1 {
				return errFull
			}
			for _, d := range h.unlink {
				if _, err := tx.ExecContext(ctx, `DELETE FROM refs WHERE digest = ?`, d[:]); err != nil {
					return err
				}
			}
			return nil
		})
	})
	queued(1)
	var out []int64
	wg.Go(func() { out, err = a.Host.Arbitrate(ctx, arb) })
	queued(2)
	wg.Go(func() {
		b.Do(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `ROLLBACK`) // all of it, savepoints or not
			return err
		})
	})
	queued(3)
	release()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		return nil, errors.New("test: the Batcher's jobs had not all returned a minute after they were let go")
	}
	return out, err
}

// TestSQLiteArbitrationRerun: an arbitration run again after its shared
// transaction rolled back reports what it did — deleted is what is gone,
// cancelled what is still there — and no large-tier blob is unlinked on
// the strength of work that rolled back: a link whose removal rolled back
// still has its blob. The kv blob whose link the other job removes is
// deleted by the first run and restored by the rollback: only the
// committed run's answer counts it right (the large one's unlink rechecks
// in a hold of its own, whatever the first run said).
func TestSQLiteArbitrationRerun(t *testing.T) {
	dir := t.TempDir()
	kv, large := sqliteKV(t, dir), localLarge(t, dir)
	h := &rerunHost{Engine: kv, t: t}
	s := openWith(t, store.Config{KV: h, Large: large})
	if _, err := kv.DB().Exec(`CREATE TABLE refs (digest BLOB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	refs, err := gc.NewTable(t.Context(), kv.DB(), "sqlite", "refs")
	if err != nil {
		t.Fatal(err)
	}
	s.GC().Register(refs)
	ds := putN(t, s, 8) // even: kv tier, odd: large tier
	if r := sweep(t, s); r.Queued != 8 {
		t.Fatalf("sweep 1: %+v", r)
	}
	// Linked after the mark, so arbitration must cancel them: a kv blob,
	// a large one, and one of each whose link the other job removes.
	lost := []blob.Digest{ds[4], ds[5]}
	linked := map[blob.Digest]bool{ds[2]: true, ds[3]: true, lost[0]: true, lost[1]: true}
	for d := range linked {
		if _, err := kv.DB().Exec(`INSERT INTO refs (digest) VALUES (?)`, d[:]); err != nil {
			t.Fatal(err)
		}
	}
	h.unlink = lost
	h.armed.Store(true)
	r := sweep(t, s)
	if n := h.unlinks.Load(); n != 2 {
		t.Fatalf("the other writer's job ran %d times; the test wants its shared transaction rolled back and it run again", n)
	}
	gone := 0
	for i, d := range ds {
		ok, err := s.Has(t.Context(), d)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			gone++
		}
		if linked[d] && !ok {
			t.Errorf("blob %d (tier %s) is linked and gone", i, map[bool]string{true: "large", false: "kv"}[i%2 == 1])
		}
	}
	if r.Deleted != gone || r.Cancelled != len(ds)-gone {
		t.Errorf("report: %d deleted, %d cancelled; but %d of %d are gone", r.Deleted, r.Cancelled, gone, len(ds))
	}
	if gone != len(ds)-len(linked) {
		t.Errorf("%d gone, want %d: every blob not linked", gone, len(ds)-len(linked))
	}
}

// between is the SQLite engine where something happens between the two
// holds of the arbitration lock: after the kv rows' delete committed,
// before the large tier's unlinks.
type between struct {
	*sqlite.Engine
	hook func(ctx context.Context) error // nil: nothing
}

// Meta is the engine's state with the host's second hold hooked.
func (h *between) Meta() meta.State {
	st := h.Engine.Meta()
	st.Host = betweenHost{SQLite: st.Host.(*meta.SQLite), b: h}
	return st
}

type betweenHost struct {
	*meta.SQLite
	b *between
}

// Arbitrate runs the hook before the second hold (the Outside form).
func (h betweenHost) Arbitrate(ctx context.Context, a meta.Arbitration) ([]int64, error) {
	if h.b.hook != nil && a.Outside != nil {
		if err := h.b.hook(ctx); err != nil {
			return nil, err
		}
	}
	return h.SQLite.Arbitrate(ctx, a)
}

func openBetween(t *testing.T) (*store.Store, *between) {
	t.Helper()
	dir := t.TempDir()
	kv, large := sqliteKV(t, dir), localLarge(t, dir)
	h := &between{Engine: kv}
	s := openWith(t, store.Config{KV: h, Large: large, Logger: slog.New(slog.DiscardHandler)})
	s.GC().Register(&refs{m: map[blob.Digest]bool{}})
	return s, h
}

// TestSQLiteUnlinkChecksAgain: the large tier's unlinks, which come after
// the transaction that decided them, check pins again: a pin committed in
// between (another process's put of the same content, which found the
// file and deduped on it) keeps its file.
func TestSQLiteUnlinkChecksAgain(t *testing.T) {
	s, h := openBetween(t)
	ds := putN(t, s, 4) // even: kv tier, odd: large tier
	if r := sweep(t, s); r.Queued != 4 {
		t.Fatalf("sweep 1: %+v", r)
	}
	h.hook = func(ctx context.Context) error {
		return h.Engine.Meta().Host.PinRows(ctx, "another-process", []blob.Digest{ds[1]}, time.Hour)
	}
	r := sweep(t, s)
	if ok, err := s.Has(t.Context(), ds[1]); err != nil || !ok {
		t.Fatalf("the blob pinned before its unlink is gone (%v)", err)
	}
	if r.Deleted != 3 || r.Cancelled != 1 {
		t.Errorf("report %+v; want 3 deleted, 1 cancelled", r)
	}
}

// TestSQLiteUnlinkLeftOver: when the process stops between the two holds
// (here the second fails), the large tier's blobs it decided stay,
// unreferenced, and a later sweep deletes them.
func TestSQLiteUnlinkLeftOver(t *testing.T) {
	s, h := openBetween(t)
	ds := putN(t, s, 4)
	if r := sweep(t, s); r.Queued != 4 {
		t.Fatalf("sweep 1: %+v", r)
	}
	h.hook = func(context.Context) error { return errors.New("test: stopped between the two") }
	if _, err := s.Sweep(t.Context()); err == nil {
		t.Fatal("sweep 2 succeeded")
	}
	for i, d := range ds {
		ok, err := s.Has(t.Context(), d)
		if err != nil || ok != (i%2 == 1) {
			t.Fatalf("after the stop, blob %d present=%v (%v); want only the large tier's", i, ok, err)
		}
	}
	// Their window rows are still there (the failed sweep removed none):
	// the next sweep executes them, the kv rows vanished, the files not.
	h.hook = nil
	if r := sweep(t, s); r.Deleted != 2 || r.Cancelled != 2 {
		t.Errorf("sweep 3: %+v; want the 2 large blobs deleted, the 2 kv rows cancelled as vanished", r)
	}
	if n := count(t, s); n != 0 {
		t.Errorf("%d blobs left; want the large tier's collected", n)
	}
}
