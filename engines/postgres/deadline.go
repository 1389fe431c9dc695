package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Bounded waits.
//
// A connection whose server has gone silent — a host cut off by a
// partition, a firewall that drops instead of rejecting, a server frozen
// by its VM — fails nothing by itself: the kernel retransmits for a
// quarter of an hour before it gives up, and a FUSE request waiting on it
// hangs as long. So every connection this package opens watches its own
// waits: while a statement (or a connect) is waiting on the server, the
// server must send something at least every op timeout, or the statement
// fails with a *TimeoutError and the connection is dropped. The timeout
// is about silence, not length: a long listing that keeps streaming rows
// never trips it, and a connection idle in the pool, with no statement in
// flight, is never timed.
//
// Design point: the watch is on the connection (a net.Conn wrapper armed
// by pgx's tracer hooks), not a context deadline, so that every user of
// the pool inherits it — the engines, the GC host, the namespace
// registries over database/sql — without each call site adding one, and
// so that the error is ours: it names the server and the bound, and it is
// not context.DeadlineExceeded, which a caller reads as its own deadline.
// A caller's shorter deadline still wins as usual.

// DefaultOpTimeout is how long a statement may wait on a silent server.
// It is below the pin renewal interval (a third of the 60 s pin TTL), so
// that a renewal tick stuck on a dead connection fails before the next
// one is due, and long enough that a loaded server's slow statement,
// which still answers, is not cut.
const DefaultOpTimeout = 15 * time.Second

// OpTimeoutParam is the DSN parameter that sets the op timeout (a Go
// duration: alkblobfs_op_timeout=5s); it is the package's, never sent to
// the server.
const OpTimeoutParam = "alkblobfs_op_timeout"

// Keepalives. The client's let the kernel notice a dead server under an
// idle pooled connection; the server's, sent as session settings unless
// the DSN sets them, let the server notice a dead client within about
// 25 s and end its session — its transaction rolls back and its locks
// (the sweep lease among them) go — instead of two hours later, the
// kernel's default.
var (
	clientKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}
	serverKeepAlive = map[string]string{
		"tcp_keepalives_idle":     "10",
		"tcp_keepalives_interval": "5",
		"tcp_keepalives_count":    "3",
	}
)

// TimeoutError is a wait on the server that saw nothing from it for the
// op timeout: the server is unreachable or not answering. The connection
// it happened on is dropped; the next operation gets a fresh one (or the
// same error while the server stays silent).
type TimeoutError struct {
	Addr  string        // host:port of the server
	Wait  string        // "connect" or "statement"
	After time.Duration // the op timeout
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("PostgreSQL at %s sent nothing for %s during a %s (unreachable or not answering; %s)", e.Addr, e.After, e.Wait, OpTimeoutParam)
}

// Timeout reports true, so that pgx treats the error as the timeout it is
// (net.Error).
func (e *TimeoutError) Timeout() bool { return true }

// Temporary is net.Error's: false.
func (e *TimeoutError) Temporary() bool { return false }

// opTimeout takes the op timeout out of cfg's run-time parameters
// (DefaultOpTimeout if absent).
func opTimeout(params map[string]string) (time.Duration, error) {
	v, ok := params[OpTimeoutParam]
	if !ok {
		return DefaultOpTimeout, nil
	}
	delete(params, OpTimeoutParam)
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive Go duration such as 15s", OpTimeoutParam, v)
	}
	return d, nil
}

// health remembers the last timed-out wait of one pool's connections.
// A server that went silent on one connection is silent on the others
// too: the pool drops every connection older than that wait instead of
// pinging each in turn (each ping would wait the op timeout), so an
// operation after a cut waits one op timeout, not one per pooled
// connection.
type health struct{ lastTimeout atomic.Int64 } // unix nanoseconds

// suspect reports whether c was dialed before the last timed-out wait.
func (h *health) suspect(c *pgx.Conn) bool {
	w := watched(c.PgConn())
	return w != nil && w.born.UnixNano() < h.lastTimeout.Load()
}

// watch sets cfg up for bounded waits: a dialer whose connections time
// their waits, the tracer that arms them, the keepalives. connect bounds
// the dial and the start-up exchange.
func watch(cfg *pgconn.Config, tr *waitTracer, h *health, connect time.Duration) {
	d := &net.Dialer{Timeout: connect, KeepAliveConfig: clientKeepAlive}
	cfg.DialFunc = func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		w := &watchedConn{Conn: c, addr: a, limit: connect, born: time.Now(), health: h}
		w.arm("connect") // disarmed by AfterConnect, below
		return w, nil
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		if w := watched(pc); w != nil {
			w.disarm()
			w.setLimit(tr.limit)
		}
		if after != nil {
			return after(ctx, pc)
		}
		return nil
	}
	for k, v := range serverKeepAlive {
		if _, ok := cfg.RuntimeParams[k]; !ok {
			cfg.RuntimeParams[k] = v
		}
	}
}

// watched is pc's watchedConn, or nil.
func watched(pc *pgconn.PgConn) *watchedConn {
	nc := pc.Conn()
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	w, _ := nc.(*watchedConn)
	return w
}

// waitTracer arms a connection's watch for every statement pgx runs on it
// (query, exec, batch, copy, prepare), and disarms it when the statement
// ends. A statement nested in another (the prepare of a cached statement)
// counts in the watch's depth.
type waitTracer struct{ limit time.Duration }

var (
	_ pgx.QueryTracer    = (*waitTracer)(nil)
	_ pgx.BatchTracer    = (*waitTracer)(nil)
	_ pgx.CopyFromTracer = (*waitTracer)(nil)
	_ pgx.PrepareTracer  = (*waitTracer)(nil)
)

func (*waitTracer) start(ctx context.Context, c *pgx.Conn) context.Context {
	if w := watched(c.PgConn()); w != nil {
		w.arm("statement")
	}
	return ctx
}

func (*waitTracer) end(c *pgx.Conn) {
	if w := watched(c.PgConn()); w != nil {
		w.disarm()
	}
}

func (t *waitTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return t.start(ctx, c)
}
func (t *waitTracer) TraceQueryEnd(_ context.Context, c *pgx.Conn, _ pgx.TraceQueryEndData) { t.end(c) }
func (t *waitTracer) TraceBatchStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return t.start(ctx, c)
}
func (*waitTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *waitTracer) TraceBatchEnd(_ context.Context, c *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.end(c)
}
func (t *waitTracer) TraceCopyFromStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	return t.start(ctx, c)
}
func (t *waitTracer) TraceCopyFromEnd(_ context.Context, c *pgx.Conn, _ pgx.TraceCopyFromEndData) {
	t.end(c)
}
func (t *waitTracer) TracePrepareStart(ctx context.Context, c *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return t.start(ctx, c)
}
func (t *waitTracer) TracePrepareEnd(_ context.Context, c *pgx.Conn, _ pgx.TracePrepareEndData) {
	t.end(c)
}

// watchedConn is a connection that times the waits its owner arms: while
// armed, a read or write that sees no progress for limit fails with a
// *TimeoutError. Deadlines the driver sets itself (on a cancelled
// context) still apply; the earlier of the two wins.
type watchedConn struct {
	net.Conn
	addr   string
	born   time.Time
	health *health

	mu     sync.Mutex
	limit  time.Duration
	depth  int    // arms not yet disarmed
	wait   string // what the armed wait is, for the error
	expiry time.Time
	moved  time.Time    // last extension of expiry
	user   [2]time.Time // the driver's read and write deadlines
}

func (w *watchedConn) setLimit(d time.Duration) {
	w.mu.Lock()
	w.limit = d
	w.mu.Unlock()
}

func (w *watchedConn) arm(what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.depth++
	w.wait = what
	w.moved = time.Now()
	w.expiry = w.moved.Add(w.limit)
	w.apply()
}

func (w *watchedConn) disarm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.depth > 0 {
		w.depth--
	}
	if w.depth == 0 {
		w.apply()
	}
}

// apply sets the socket's deadlines: the driver's, or the armed expiry if
// sooner. Called with mu held.
func (w *watchedConn) apply() {
	eff := func(u time.Time) time.Time {
		if w.depth > 0 && (u.IsZero() || w.expiry.Before(u)) {
			return w.expiry
		}
		return u
	}
	w.Conn.SetReadDeadline(eff(w.user[0]))
	w.Conn.SetWriteDeadline(eff(w.user[1]))
}

// progress moves an armed expiry on: the server is there. To keep the
// cost off every small read, only once a quarter of the limit has passed.
func (w *watchedConn) progress() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.depth == 0 {
		return
	}
	if now := time.Now(); now.Sub(w.moved) > w.limit/4 {
		w.moved = now
		w.expiry = now.Add(w.limit)
		w.apply()
	}
}

// timedOut turns the timeout of an armed wait into a *TimeoutError.
func (w *watchedConn) timedOut(err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.depth == 0 || time.Now().Before(w.expiry) {
		return err // the driver's own deadline
	}
	w.health.lastTimeout.Store(time.Now().UnixNano())
	return &TimeoutError{Addr: w.addr, Wait: w.wait, After: w.limit}
}

func (w *watchedConn) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	if n > 0 {
		w.progress()
	}
	if err != nil {
		err = w.timedOut(err)
	}
	return n, err
}

func (w *watchedConn) Write(b []byte) (int, error) {
	n, err := w.Conn.Write(b)
	if n > 0 {
		w.progress()
	}
	if err != nil {
		err = w.timedOut(err)
	}
	return n, err
}

func (w *watchedConn) SetDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.user = [2]time.Time{t, t}
	w.apply()
	return nil
}

func (w *watchedConn) SetReadDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.user[0] = t
	w.apply()
	return nil
}

func (w *watchedConn) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.user[1] = t
	w.apply()
	return nil
}

// SyscallConn exposes the socket (peerSpoke peeks at it).
func (w *watchedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := w.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("not a socket")
	}
	return sc.SyscallConn()
}
