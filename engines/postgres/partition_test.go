package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/enginetest/faultproxy"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// proxied returns dsn through a new fault proxy, with op timeout limit.
func proxied(t *testing.T, dsn string, limit time.Duration) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(t, u.Host)
	u, _ = url.Parse(p.URL(t, dsn))
	q := u.Query()
	q.Set(postgres.OpTimeoutParam, limit.String())
	u.RawQuery = q.Encode()
	return p, u.String()
}

// within runs op and fails unless it returns a *postgres.TimeoutError
// within bound.
func within(t *testing.T, what string, bound time.Duration, op func() error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		took := time.Since(start)
		var te *postgres.TimeoutError
		if !errors.As(err, &te) {
			t.Fatalf("%s through a blackhole: %v after %s; want a *postgres.TimeoutError", what, err, took)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v reads as the caller's own deadline", what, err)
		}
		t.Logf("%s: %s after %s", what, err, took.Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("%s through a blackhole still waiting after %s", what, bound)
	}
}

// TestBlackholeBounded: with the server silent (a blackhole between the
// engine and it), every operation — on a pooled connection that was
// healthy, on a new connection, on database/sql, and the sweep lease on
// its own connection — fails within the op timeout with an error naming
// the server and the bound; once the path is back, the same engine works
// without reopening.
func TestBlackholeBounded(t *testing.T) {
	const limit = time.Second
	bound := 3 * limit // the op timeout, plus a loaded machine's slack
	p, dsn := proxied(t, pgtest.DSN(t), limit)
	e := open(t, dsn)
	t.Cleanup(func() { e.Close() })
	ctx := t.Context()
	v := []byte("before the cut")
	d := blob.Sum(v)
	if _, err := e.Put(ctx, d, v); err != nil {
		t.Fatal(err)
	}
	pgtest.Warm(t, e.Pool(), 4)

	p.Blackhole()
	within(t, "Has", bound, func() error { _, err := e.Has(ctx, d); return err })
	within(t, "Put", bound, func() error {
		w := []byte("during the cut")
		_, err := e.Put(ctx, blob.Sum(w), w)
		return err
	})
	within(t, "database/sql", bound, func() error {
		var n int
		return e.DB().QueryRowContext(ctx, `SELECT count(*) FROM blobs`).Scan(&n)
	})
	within(t, "sweep lease", bound, func() error { _, _, err := e.Meta().Host.SweepLease(ctx); return err })

	// A caller's own cancellation is still its own.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(limit/4, cancel)
	if _, err := e.Has(cctx, d); !errors.Is(err, context.Canceled) {
		t.Fatalf("Has with a context cancelled during the cut = %v; want context.Canceled", err)
	}

	p.Restore()
	if ok, err := e.Has(ctx, d); !ok || err != nil {
		t.Fatalf("Has after the path is back = %v, %v", ok, err)
	}
}

// TestOpTimeoutIsSilence: the op timeout bounds silence, not length: a
// listing that streams for longer than the timeout completes, and a
// statement the server sits on for longer fails. The limit is 1 s: it
// bounds the engine's first connect too, whose SCRAM handshake under
// -race took over 250 ms on a loaded machine.
func TestOpTimeoutIsSilence(t *testing.T) {
	const limit = time.Second
	_, dsn := proxied(t, pgtest.DSN(t), limit)
	e := open(t, dsn)
	t.Cleanup(func() { e.Close() })
	ctx := t.Context()
	// Rows that trickle out for 2 × limit, a row every limit/5, each
	// large enough for the server to flush it on its own.
	rows, err := e.Pool().Query(ctx, `SELECT i, pg_sleep(0.2), repeat('x', 65536) FROM generate_series(1, 10) i`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if rows.Close(); rows.Err() != nil || n != 10 {
		t.Fatalf("a streaming query longer than the op timeout: %d rows, %v", n, rows.Err())
	}
	err = e.Pool().QueryRow(ctx, `SELECT pg_sleep(3)`).Scan(new(any))
	var te *postgres.TimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("a statement silent for 3 × the op timeout = %v; want a *postgres.TimeoutError", err)
	}
	// The pool must recover: the next statement gets a fresh connection.
	// On a loaded machine that connection's own handshake (SCRAM) can be
	// silent past the op timeout too, which is the timeout doing its job,
	// so only a TimeoutError may delay success, for a bounded time.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := e.Has(ctx, blob.Sum(nil))
		if err == nil && !ok {
			return
		}
		if !errors.As(err, &te) || time.Now().After(deadline) {
			t.Fatalf("Has after a timed-out statement = %v, %v (want false, nil within 30s; only op timeouts may come before)", ok, err)
		}
		t.Logf("Has after a timed-out statement timed out again (a loaded machine): %v", err)
	}
}

// TestOpTimeoutParam: a bad op timeout is a bad DSN, named.
func TestOpTimeoutParam(t *testing.T) {
	dsn := pgtest.DSN(t)
	for _, v := range []string{"soon", "0s", "-1s"} {
		u, _ := url.Parse(dsn)
		q := u.Query()
		q.Set(postgres.OpTimeoutParam, v)
		u.RawQuery = q.Encode()
		_, err := postgres.Open(t.Context(), u.String())
		if !errors.Is(err, postgres.ErrBadDSN) {
			t.Fatalf("%s=%s: %v; want ErrBadDSN", postgres.OpTimeoutParam, v, err)
		}
	}
}
