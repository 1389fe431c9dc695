package gc_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/meta"
)

// dropSeen is a host that reports when Close reaches its drop of the
// owner's rows.
type dropSeen struct {
	meta.SerialHost
	dropped chan struct{}
}

func (h *dropSeen) DropOwner(ctx context.Context, owner string) error {
	close(h.dropped)
	return h.SerialHost.DropOwner(ctx, owner)
}

// TestRowlessPublishCloseWaits: a rowless put (BeginPublish, linked, on
// SQLite) keeps the discipline of a put that writes its pin row: Close
// waits for its transaction to end before it drops the owner's rows and
// lets the store close the database under it, and a put after Close has
// begun is refused.
func TestRowlessPublishCloseWaits(t *testing.T) {
	ctx := t.Context()
	e, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	h := &dropSeen{SerialHost: e.Meta().Host.(meta.SerialHost), dropped: make(chan struct{})}
	c := gctest.NewPool(gc.Options{Host: h, Window: e.Meta().Window, PinTTL: time.Hour}).C

	started, finish := make(chan struct{}), make(chan struct{})
	put := make(chan error, 1)
	go func() {
		pub, row, err := c.BeginPublish(ctx, dg(1), true)
		if err == nil && row != nil {
			err = errors.New("a linked put on SQLite was handed a pin row")
		}
		if err != nil {
			close(started)
			put <- err
			return
		}
		close(started)
		<-finish // the put's transaction, still running
		pin, err := pub.Done(nil)
		pin.Release()
		put <- err
	}()
	<-started
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	// A put after Close has begun is refused. The probe runs on its own:
	// once Close waits for the running put, a probe that passed the
	// closed check before Close set it waits too, until the put ends.
	probe := make(chan error, 1)
	go func() {
		for {
			pub, _, err := c.BeginPublish(ctx, dg(2), true)
			var pin *gc.Pin
			if err == nil {
				pin, err = pub.Done(nil)
			}
			if err != nil {
				probe <- err
				return
			}
			pin.Release()
		}
	}()
	// Close may not reach its drop while the put runs. A bound, not an
	// ordering: with the put holding rowMu, no wait is long enough.
	select {
	case <-h.dropped:
		t.Fatal("Close dropped the owner's rows while a linked put's transaction ran")
	case <-time.After(2 * time.Second):
	}
	close(finish)
	if err := <-put; err != nil {
		t.Fatalf("the linked put: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-probe:
		if !errors.Is(err, blob.ErrClosed) {
			t.Fatalf("a put after Close began: %v; want ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a put after Close began neither returned nor was refused 30 s after Close returned")
	}
}
