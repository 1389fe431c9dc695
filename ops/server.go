package ops

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/wire"
)

// DefaultTokenTTL is how long a pin token lives after its put or its last
// renewal (seeds: the pin TTL; a putter renews every TTL/3).
const DefaultTokenTTL = 60 * time.Second

// MaxHave is the most digests one have request may ask about.
const MaxHave = wire.MaxHave

// maxJSON bounds a JSON request body: MaxHave digests of 64 hex digits
// with their quotes and commas, and room to spare.
const maxJSON = 2 << 20

// Config configures a Server.
type Config struct {
	Store *store.Store
	// Namespaces is where puts link and haves look. Nil for a store that
	// keeps none: then put and have answer 503 and only reads work.
	Namespaces *namespaces.Service
	// TokenTTL is the life of an unrenewed pin token; 0 means
	// DefaultTokenTTL.
	TokenTTL time.Duration
	// Clock times tokens; nil means the wall clock. Tests share one fake
	// clock between the store's GC and the server.
	Clock store.Clock
	// AuthToken, if set, is the bearer token every request must carry.
	AuthToken string
	// Metrics, if set, is shared with a mount; nil makes the store's own.
	// The server's Close closes it.
	Metrics *Metrics
	// ReadOnly refuses puts and deletes (403), as a read-only mount
	// refuses changes.
	ReadOnly bool
	// Memory bounds the bytes requests hold in memory together (put bodies
	// up to the kv threshold, ranged reads); 0 means
	// store.DefaultUploadMemory. A request waits for its share.
	Memory int64
	Logger *slog.Logger
}

// Server is the HTTP ops surface of one store.
type Server struct {
	st      *store.Store
	ns      *namespaces.Service
	tokens  *tokens
	metrics *Metrics
	log     *slog.Logger
	auth    [sha256.Size]byte
	hasAuth bool
	ro      bool
	mux     *http.ServeMux

	// handlers counts the requests being handled; once closing is set no
	// request starts (503), so that Serve can wait for the rest.
	gate     sync.Mutex
	closing  bool
	handlers sync.WaitGroup

	// mem bounds the bytes requests hold in memory together: put bodies
	// up to the kv threshold, ranged reads.
	mem *semaphore.Weighted
}

// New returns a server over cfg.Store. Close releases the pins its
// tokens hold.
func New(cfg Config) *Server {
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = DefaultTokenTTL
	}
	if cfg.Clock == nil {
		cfg.Clock = store.RealClock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(cfg.Store)
	}
	if cfg.Memory <= 0 {
		cfg.Memory = store.DefaultUploadMemory
	}
	s := &Server{
		st:      cfg.Store,
		ns:      cfg.Namespaces,
		tokens:  newTokens(cfg.TokenTTL, cfg.Clock),
		metrics: cfg.Metrics,
		log:     cfg.Logger,
		ro:      cfg.ReadOnly || cfg.Store.ReadOnly(),
		mem:     semaphore.NewWeighted(max(cfg.Memory, store.MaxReadRange)),
	}
	if cfg.AuthToken != "" {
		// Compared as digests: constant time, whatever the lengths.
		s.auth, s.hasAuth = sha256.Sum256([]byte(cfg.AuthToken)), true
	}
	live := s.tokens.len
	s.metrics.tokens.Store(&live)
	s.mux = http.NewServeMux()
	s.route("POST /v1/blobs", "put", s.put)
	s.route("POST /v1/blobs/have", "have", s.have)
	s.route("GET /v1/blobs/{digest}", "get", s.get) // and HEAD
	s.route("DELETE /v1/blobs/{digest}", "delete", s.delete)
	s.route("DELETE /v1/pins/{token}", "release", s.release)
	metrics := s.metrics.Handler()
	s.mux.Handle("GET /metrics", s.counted("metrics", func(w http.ResponseWriter, r *http.Request) error {
		metrics.ServeHTTP(w, r)
		return nil
	}))
	s.mux.Handle("/", s.counted("unknown", func(w http.ResponseWriter, r *http.Request) error {
		return notFound("no such endpoint: %s %s (see GET /v1/blobs/DIGEST, POST /v1/blobs, POST /v1/blobs/have, /metrics)", r.Method, clip(r.URL.Path))
	}))
	return s
}

// Handler is the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Close refuses new requests (503), waits for those being handled,
// releases every token's pin and stops the metrics' background work.
func (s *Server) Close() {
	s.gate.Lock()
	s.closing = true
	s.gate.Unlock()
	s.handlers.Wait()
	s.tokens.close()
	s.metrics.Close()
}

// shutdownGrace is how long requests in flight may take to finish once
// Serve's context ends; then they are cut off.
const shutdownGrace = 10 * time.Second

// Serve answers requests on ln until ctx ends, then shuts down gracefully:
// it stops accepting, lets requests in flight finish (for up to 10 s, then
// cuts them off), waits for their handlers, and releases every token.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// Requests get a context of their own that ctx ending does not cancel:
	// a shutdown lets them finish first.
	reqCtx, cutOff := context.WithCancel(context.WithoutCancel(ctx))
	defer cutOff()
	hs := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
	}
	stop := make(chan struct{})
	go s.expireLoop(stop)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		if hs.Shutdown(sctx) != nil {
			s.log.Warn("requests still running after the shutdown grace period; cutting them off", "grace", shutdownGrace)
			cutOff()
			hs.Close()
		}
		cancel()
		err = <-served
	case err = <-served: // the listener failed
		cutOff()
		hs.Close()
	}
	close(stop)
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// expireLoop releases lapsed tokens' pins a few times per TTL, so that a
// putter that went away stops protecting its blob on time even if no
// request ever names its token again.
func (s *Server) expireLoop(stop <-chan struct{}) {
	tick := time.NewTicker(max(s.tokens.ttl/10, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			s.tokens.expire()
		}
	}
}

// ExpireTokens releases the pins of lapsed tokens now (the server also
// does it on a ticker) and returns how many it released.
func (s *Server) ExpireTokens() int { return s.tokens.expire() }

// route registers a handler that returns its error instead of writing it.
func (s *Server) route(pattern, name string, h func(http.ResponseWriter, *http.Request) error) {
	s.mux.Handle(pattern, s.counted(name, h))
}

// counted wraps h with authentication, error answers, logging and
// metrics.
func (s *Server) counted(name string, h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			// An aborted answer (panic(http.ErrAbortHandler)) is counted
			// too, by the status it had started with.
			if sw.status == 0 {
				sw.status = http.StatusOK
			}
			s.metrics.requests.WithLabelValues(name, fmt.Sprint(sw.status)).Inc()
		}()
		var err error
		s.gate.Lock()
		closing := s.closing
		if !closing {
			s.handlers.Add(1)
			defer s.handlers.Done()
		}
		s.gate.Unlock()
		switch {
		case closing:
			err = errShuttingDown
		case !s.authorized(r):
			sw.Header().Set("WWW-Authenticate", `Bearer realm="alkblobfs"`)
			err = &httpError{http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token (Authorization: Bearer …)"}
		default:
			s.log.Debug("http request", "route", name, "method", r.Method, "path", r.URL.Path)
			err = h(sw, r)
		}
		if err == nil {
			return
		}
		status, kind := classify(err)
		s.metrics.countError(kind)
		if status >= 500 {
			s.log.Error("http request failed", "route", name, "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
		} else {
			s.log.Debug("http request refused", "route", name, "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
		}
		if sw.status == 0 {
			if status == http.StatusServiceUnavailable {
				sw.Header().Set("Retry-After", "5")
			}
			writeJSON(sw, status, errorBody{Error: err.Error()})
		}
	})
}

var errShuttingDown = &httpError{http.StatusServiceUnavailable, "unavailable", "the server is shutting down"}

func (s *Server) authorized(r *http.Request) bool {
	if !s.hasAuth {
		return true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(got[:], s.auth[:]) == 1
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Listen opens addr for the server. An address that is not loopback needs
// an auth token: without one Listen refuses, so that a store is never
// served to the network unauthenticated by accident.
func Listen(addr string, authToken string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if authToken == "" && !loopback(ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("listen %s: %w", addr, ErrNeedsAuth)
	}
	return ln, nil
}

// ErrNeedsAuth: a non-loopback listen address without an auth token.
var ErrNeedsAuth = errors.New("a non-loopback address needs a bearer token: give --auth-token-file FILE, or listen on 127.0.0.1 or [::1]")

func loopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// ReadAuthToken reads a bearer token from file: its first line, trimmed.
// An empty token is an error, and so is a file others may read (it would
// hand the store to every local user).
func ReadAuthToken(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("auth token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // the file read, not whatever the name points at later
	if err != nil {
		return "", fmt.Errorf("auth token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("auth token file %s: mode %04o lets other users read it; chmod 600 %s", file, fi.Mode().Perm(), file)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", fmt.Errorf("auth token file: %w", err)
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("auth token file %s is empty", file)
	}
	return tok, nil
}
