package gc_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/meta"
)

// lostAnswer is a host whose pin row writes commit and then, while lose
// is set, report failure: what a connection reset or an op timeout
// between the server's COMMIT and its answer does.
type lostAnswer struct {
	meta.Host
	lose atomic.Bool
}

func (h *lostAnswer) PinRows(ctx context.Context, owner string, ds []blob.Digest, ttl time.Duration) error {
	if err := h.Host.PinRows(ctx, owner, ds, ttl); err != nil {
		return err
	}
	if h.lose.Load() {
		return errors.New("connection reset by peer (after the COMMIT reached the server)")
	}
	return nil
}

// TestPinRowCommitLost: a pin whose row committed but whose answer was
// lost fails, and its process forgets the digest; the row must not stay
// renewed behind its back. The first renewal drops it (so that another
// host's arbitration may delete the blob), says so, and a later pin of
// the same digest writes and keeps a row of its own. Before the fix the
// row was renewed at every tick for the life of the process: the leak of
// TestFleetAcceptance's long run (a blob no sweep ever took, held by a
// live owner's row with no pending put and no link).
func TestPinRowCommitLost(t *testing.T) {
	dsn := pgtest.DSN(t)
	e, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	h := &lostAnswer{Host: e.Meta().Host}
	var log logBuf
	// A TTL of an hour: the renewal loop stays out of the way, the test
	// ticks by hand.
	c := gctest.NewPool(gc.Options{Host: h, Window: e.Meta().Window, PinTTL: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}).C
	t.Cleanup(func() { c.Close() })
	rowOf := func(d blob.Digest) bool {
		var n int
		if err := e.Pool().QueryRow(t.Context(), `SELECT count(*) FROM gc_pins WHERE owner = $1 AND digest = $2`, c.Owner(), d[:]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}

	lost, many := dg(1), []blob.Digest{dg(2), dg(3)}
	h.lose.Store(true)
	if _, err := c.Pin(t.Context(), lost); err == nil {
		t.Fatal("the pin whose answer was lost succeeded")
	}
	if _, err := c.PinMany(t.Context(), many); err == nil {
		t.Fatal("the pins whose answer was lost succeeded")
	}
	h.lose.Store(false)
	if !rowOf(lost) || !rowOf(many[0]) {
		t.Fatal("the lost answers' rows did not commit: the fake does not lose answers")
	}
	if d, _ := c.PinCount(); d != 0 {
		t.Fatalf("%d digests pinned after the pins failed", d)
	}
	if err := c.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, d := range append([]blob.Digest{lost}, many...) {
		if rowOf(d) {
			t.Fatalf("%s: a row no pin of its process accounts for is still there after a renewal", d)
		}
	}
	if got := c.Strays(); got != 3 {
		t.Fatalf("Strays = %d, want 3", got)
	}
	if !strings.Contains(log.String(), "no pin of this process accounts for") {
		t.Fatalf("the stray rows were not logged:\n%s", log.String())
	}

	// A pin of the digest again has its row, kept by renewal.
	p := mustPin(t, c, lost)
	defer p.Release()
	if err := c.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !rowOf(lost) {
		t.Fatal("a held pin lost its row at renewal")
	}
	if got := c.Strays(); got != 3 {
		t.Fatalf("Strays = %d after a renewal of a held row, want 3", got)
	}
}
