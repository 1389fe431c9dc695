package gc_test

import (
	"bytes"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/engines/enginetest/faultproxy"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
)

// logBuf is a log sink a test can read while the collector writes to it.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCutOffPinsLapse: a collector cut off from its PostgreSQL host (a
// blackhole) for longer than the pin TTL says, while still cut off, that
// its rows are lapsing; once the path is back, its first renewal counts
// the lapsed rows and re-pins what it still holds (and not what it
// released meanwhile), so that another host's arbitration sees the pin
// again.
//
// The op timeout is half the TTL, as in the CLI's partition tests: it
// bounds every wait on the cut-off path, connecting included, so a
// shorter one fails the engine's open on a loaded machine (a SCRAM
// handshake took over 250 ms at load 28).
func TestCutOffPinsLapse(t *testing.T) {
	const ttl = 2 * time.Second
	const opWait = ttl / 2
	dsn := pgtest.DSN(t)
	u, _ := url.Parse(dsn)
	p := faultproxy.New(t, u.Host)
	u, _ = url.Parse(p.URL(t, dsn))
	q := u.Query()
	q.Set(postgres.OpTimeoutParam, opWait.String())
	u.RawQuery = q.Encode()
	e, err := postgres.Open(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	// A second engine, straight to the server: another host's view.
	other, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })

	var log logBuf
	c := gctest.NewPool(gc.Options{Host: e.Meta().Host, Window: e.Meta().Window, PinTTL: ttl,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}).C
	t.Cleanup(func() { c.Close() })
	held, dropped := dg(1), dg(2)
	pin := mustPin(t, c, held)
	defer pin.Release()
	mustPin(t, c, dropped).Release()
	rows := func() map[string]bool {
		got := map[string]bool{}
		r, err := other.Pool().Query(t.Context(), `SELECT digest FROM gc_pins WHERE owner = $1 AND expiry > `+
			`(SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint)`, c.Owner())
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for r.Next() {
			var b []byte
			r.Scan(&b)
			got[string(b)] = true
		}
		return got
	}
	if !rows()[string(held[:])] {
		t.Fatal("the pin wrote no row")
	}

	p.Blackhole()
	eventually(t, 10*ttl+5*time.Second, "the row to lapse on the server", func() bool { return !rows()[string(held[:])] })
	eventually(t, 10*ttl+5*time.Second, "the cut-off collector to log its lapse", func() bool {
		return strings.Contains(log.String(), "pin rows lapsing")
	})
	if c.Lapsed() != 0 {
		t.Fatalf("Lapsed = %d while still cut off; the lapse is counted when the rows are seen gone", c.Lapsed())
	}

	p.Restore()
	eventually(t, 10*ttl+5*time.Second, "the lapse to be counted", func() bool { return c.Lapsed() > 0 })
	eventually(t, 5*ttl, "the held digest to be re-pinned", func() bool { return rows()[string(held[:])] })
	if rows()[string(dropped[:])] {
		t.Fatal("a digest released before the cut was re-pinned")
	}
	if strings.Count(log.String(), "pin rows lapsing") != 1 {
		t.Fatalf("the lapse was logged %d times; want once per outage:\n%s", strings.Count(log.String(), "pin rows lapsing"), log.String())
	}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
