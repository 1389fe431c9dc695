package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrBadDSN is returned by Connect (and the engines' Open) for a DSN that
// does not parse: the caller's mistake, as opposed to a server that cannot
// be reached.
var ErrBadDSN = errors.New("invalid PostgreSQL DSN")

// Server names a PostgreSQL server and database for messages: never a
// password.
type Server struct {
	User, Host, Database string
	Port                 uint16
}

// Addr is host:port (a socket directory for a Unix socket, then ":port").
func (s Server) Addr() string {
	return net.JoinHostPort(s.Host, strconv.Itoa(int(s.Port)))
}

// String is postgres://user@host:port/database.
func (s Server) String() string {
	u := url.URL{Scheme: "postgres", Host: s.Addr(), Path: "/" + s.Database}
	if s.User != "" {
		u.User = url.User(s.User)
	}
	if strings.HasPrefix(s.Host, "/") {
		// A socket directory is no URL host; keep it readable.
		return fmt.Sprintf("postgres://%s@[%s]:%d/%s", s.User, s.Host, s.Port, s.Database)
	}
	return u.String()
}

// Pool defaults. Stages of the pglo engine hold a connection for their
// whole life, so the pool is larger than pgxpool's default (4): a few slow
// writers must not starve every other operation. A DSN's pool_max_conns
// wins.
const (
	minPoolConns       = 16
	defaultConnTimeout = 10 * time.Second
	// idleConnLife closes connections idle this long, so a store that is
	// quiet most of the time does not hold server slots.
	idleConnLife = 5 * time.Minute
)

// Connect parses dsn (a postgres:// URL or key=value DSN, as libpq), opens
// a pool and checks that the server answers. Every error is one line that
// names the server (user@host:port/database) and never the password.
//
// The pool pings a pooled connection before handing it out when it has
// been idle over a second (pgxpool's default) or when the server has
// written to it while it sat idle: after a server restart, the old
// connections hold the server's "terminating connection" message and EOF,
// so they are dropped at once rather than failing the next operations one
// by one.
func Connect(ctx context.Context, dsn string) (*pgxpool.Pool, Server, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, Server{}, fmt.Errorf("%w: %s", ErrBadDSN, Redact(dsn, parseMessage(err)))
	}
	srv := Server{User: cfg.ConnConfig.User, Host: cfg.ConnConfig.Host, Port: cfg.ConnConfig.Port, Database: cfg.ConnConfig.Database}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = int32(max(minPoolConns, 4*runtime.GOMAXPROCS(0)))
	}
	if !strings.Contains(dsn, "pool_max_conn_idle_time") {
		cfg.MaxConnIdleTime = idleConnLife
	}
	limit, err := opTimeout(cfg.ConnConfig.RuntimeParams)
	if err != nil {
		return nil, Server{}, fmt.Errorf("%w: %s", ErrBadDSN, err)
	}
	// The connect is bounded by the dialer and the connection's watch
	// (watch), not by pgconn's ConnectTimeout, whose context deadline
	// would read as the caller's own.
	connect := cfg.ConnConfig.ConnectTimeout
	if connect == 0 {
		connect = min(defaultConnTimeout, limit)
	}
	cfg.ConnConfig.ConnectTimeout = 0
	tr, h := &waitTracer{limit: limit}, &health{}
	cfg.ConnConfig.Tracer = tr
	watch(&cfg.ConnConfig.Config, tr, h, connect)
	// A pooled connection's health check at acquire (ShouldPing below)
	// waits no longer than a statement; a silent one is dropped and the
	// next tried. Connections older than a timed-out wait are dropped
	// unpinged.
	cfg.PingTimeout = limit
	cfg.PrepareConn = func(_ context.Context, c *pgx.Conn) (bool, error) { return !h.suspect(c), nil }
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		return !h.suspect(p.Conn) && (p.IdleDuration > time.Second || peerSpoke(p.Conn))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, srv, &connectError{Redact(dsn, fmt.Sprintf("%s: %s", srv, oneLine(err))), err}
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, srv, &connectError{Redact(dsn, connectMessage(srv, err)), err}
	}
	return pool, srv, nil
}

// connectError is a failure to reach the server: a one-line message of our
// own (the driver's may span lines), and the cause for errors.Is (a
// canceled context, say).
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

// connectMessage describes a failure to reach srv in one line.
func connectMessage(srv Server, err error) string {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		// ConnectError's own text leads with user and database and may span
		// lines (one per address tried); its cause names host:port.
		err = errors.Unwrap(ce)
	}
	// One cause per address and TLS mode tried; sslmode=prefer tries twice
	// and fails the same way twice.
	var causes []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" && !slices.Contains(causes, l) {
			causes = append(causes, l)
		}
	}
	return fmt.Sprintf("cannot connect to PostgreSQL at %s (database %q, user %q): %s", srv.Addr(), srv.Database, srv.User, strings.Join(causes, "; "))
}

// parseMessage is a parse error's text without the DSN that pgx quotes.
func parseMessage(err error) string {
	s := oneLine(err)
	// "cannot parse `<dsn>`: msg (cause)": the DSN part is redacted by pgx
	// on a best-effort basis only, so it is cut out altogether.
	if i := strings.Index(s, "`: "); strings.HasPrefix(s, "cannot parse `") && i > 0 {
		s = s[i+3:]
	}
	return s
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Redact removes dsn's password from msg. Errors built by this package
// never include the DSN; this is the second belt, in case a driver or
// server message quotes it.
func Redact(dsn, msg string) string {
	for _, pw := range passwords(dsn) {
		if len(pw) > 0 {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return msg
}

// passwords finds the password spellings in a URL or key=value DSN, raw and
// decoded.
func passwords(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw)
		}
	}
	if i := strings.Index(dsn, "://"); i >= 0 {
		// The raw (still escaped) form, even when url.Parse failed.
		rest := dsn[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				out = append(out, pw)
				if dec, err := url.PathUnescape(pw); err == nil {
					out = append(out, dec)
				}
			}
		}
		if u, err := url.Parse(dsn); err == nil {
			out = append(out, u.Query()["password"]...)
		}
	}
	for _, f := range strings.Fields(dsn) {
		if v, ok := strings.CutPrefix(f, "password="); ok {
			out = append(out, strings.Trim(v, "'"))
		}
	}
	// Longest first, so a password containing another is replaced whole.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}
