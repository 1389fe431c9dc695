package ops

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/upkeep"
	"github.com/alkblobfs/alkblobfs/wire"
)

// DefaultTokenTTL is how long a pin token lives after its put or its last
// renewal (seeds: the pin TTL; a putter renews every TTL/3).
const DefaultTokenTTL = 60 * time.Second

// The defaults of Config's bounds.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxTokens         = 65536
	DefaultPermTTL           = 250 * time.Millisecond
)

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
	// Tokens are the bearer tokens a TCP request may carry, each acting as
	// its principal (ReadTokenFile). A request on a Unix socket is its
	// peer's and needs none.
	Tokens *Tokens
	// AuthToken, if set, is one more bearer token, acting as Owner with
	// every verb.
	AuthToken string
	// Owner is the server's own user: a namespace made without a Perm
	// (alkblobfs ns create) shows as Owner's, mode 0755, as on the mount,
	// and Owner (like root) may delete a blob from the store. Nil means
	// the process's uid and gid.
	Owner *namespaces.Principal
	// InsecureLoopback lets a request without credentials act as Owner
	// (a loopback listener for a single-user machine: every local user
	// then acts as Owner).
	InsecureLoopback bool
	// ReadHeaderTimeout bounds the wait for a request's headers;
	// BodyTimeout the wait for each read of a body (an upload that sends
	// nothing for that long is cut, and its memory returned) and for each
	// write of an answer; IdleTimeout how long a kept-alive connection
	// waits for its next request. 0 means the Default* values.
	ReadHeaderTimeout, BodyTimeout, IdleTimeout time.Duration
	// PermTTL is how long a namespace's Perm is cached: a chmod is
	// enforced within it. 0 means DefaultPermTTL; negative, no cache.
	PermTTL time.Duration
	// MaxTokens bounds the live pin tokens of one principal; a put past it
	// is 429. 0 means DefaultMaxTokens.
	MaxTokens int
	// MemoryShare bounds the bytes one principal's requests hold in memory
	// together, so that one user cannot take all of Memory; 0 means a
	// quarter of Memory (at least the kv threshold).
	MemoryShare int64
	// Metrics, if set, is shared with a mount; nil makes the store's own.
	// The server's Close closes it.
	Metrics *Metrics
	// ReadOnly refuses puts and deletes (403), as a read-only mount
	// refuses changes.
	ReadOnly bool
	// Upkeep, if set, is the upkeep that sweeps and scrubs the store (the
	// mount's, or serve's): the /v1/upkeep routes read and drive it.
	Upkeep *upkeep.Upkeep
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
	ro      bool
	mux     *http.ServeMux

	// Who may call: tokenFile's tokens, the Unix socket's peers (ids
	// resolves their groups), and, with insecure, anyone as owner.
	tokenFile *Tokens
	ids       identities
	owner     *Caller
	insecure  bool

	readHeader, body, idle time.Duration

	permTTL time.Duration
	permMu  sync.Mutex
	perms   map[string]permEntry
	permGen uint64 // bumped by forgetPerms, under permMu

	// handlers counts the requests being handled; once closing is set no
	// request starts (503), so that Serve can wait for the rest.
	gate     sync.Mutex
	closing  bool
	handlers sync.WaitGroup

	// mem bounds the bytes requests hold in memory together: put bodies
	// up to the kv threshold, ranged reads; shares[uid] the part of it one
	// principal's requests hold, at most share.
	mem     *semaphore.Weighted
	memSize int64
	share   int64
	sharesM sync.Mutex
	shares  map[uint32]*semaphore.Weighted
	held    atomic.Int64

	// usages is the namespaces' usage /metrics reports.
	usages recounter[nsUsage]
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
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	if cfg.Owner == nil {
		cfg.Owner = &namespaces.Principal{UID: uint32(os.Getuid()), GIDs: []uint32{uint32(os.Getgid())}}
	}
	memSize := max(cfg.Memory, cfg.Store.Threshold())
	if cfg.MemoryShare <= 0 {
		cfg.MemoryShare = memSize / 4
	}
	s := &Server{
		st:         cfg.Store,
		ns:         cfg.Namespaces,
		tokens:     newTokens(cfg.TokenTTL, cfg.Clock, cfg.MaxTokens),
		metrics:    cfg.Metrics,
		log:        cfg.Logger,
		ro:         cfg.ReadOnly || cfg.Store.ReadOnly(),
		tokenFile:  cfg.Tokens,
		insecure:   cfg.InsecureLoopback,
		readHeader: orDefault(cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		body:       orDefault(cfg.BodyTimeout, DefaultBodyTimeout),
		idle:       orDefault(cfg.IdleTimeout, DefaultIdleTimeout),
		permTTL:    orDefault(cfg.PermTTL, DefaultPermTTL),
		perms:      map[string]permEntry{},
		mem:        semaphore.NewWeighted(memSize),
		memSize:    memSize,
		// A put holds up to the threshold at once: a share is never less.
		share:  min(memSize, max(cfg.MemoryShare, cfg.Store.Threshold())),
		shares: map[uint32]*semaphore.Weighted{},
	}
	if cfg.PermTTL < 0 {
		s.permTTL = 0
	}
	s.usages = recounter[nsUsage]{every: nsInterval, count: countUsages(cfg.Namespaces, cfg.Logger)}
	s.owner = &Caller{Principal: s.ids.principal(cfg.Owner.UID, first(cfg.Owner.GIDs)), Verbs: AllVerbs}
	if cfg.AuthToken != "" {
		if s.tokenFile == nil {
			s.tokenFile = &Tokens{}
		}
		s.tokenFile.entries = append(s.tokenFile.entries, tokenEntry{sum: sha256.Sum256([]byte(cfg.AuthToken)), uid: cfg.Owner.UID, verbs: AllVerbs})
	}
	live := s.tokens.len
	s.metrics.tokens.Store(&live)
	s.mux = http.NewServeMux()
	s.route("POST /v1/blobs", "put", s.put)
	s.route("POST /v1/blobs/have", "have", s.have)
	s.route("GET /v1/blobs/{digest}", "get", s.get) // and HEAD
	s.route("DELETE /v1/blobs/{digest}", "delete", s.delete)
	s.route("DELETE /v1/pins/{token}", "release", s.release)
	if cfg.Upkeep != nil {
		s.upkeepRoutes(cfg.Upkeep)
	}
	s.namespaceRoutes()
	metrics := s.metrics.Handler()
	s.mux.Handle("GET /metrics", s.counted("metrics", func(w http.ResponseWriter, r *http.Request) error {
		if s.ns == nil {
			metrics.ServeHTTP(w, r)
			return nil
		}
		// The namespaces' usage is the caller's to see only where it may
		// search: a collector of its own for this scrape.
		s.metrics.handlerWith(&nsCollector{s: s, c: caller(r), ctx: r.Context()}).ServeHTTP(w, r)
		return nil
	}))
	s.mux.Handle("/", s.counted("unknown", func(w http.ResponseWriter, r *http.Request) error {
		return notFound("no such endpoint: %s %s (see GET /v1/blobs/DIGEST, POST /v1/blobs, POST /v1/blobs/have, /v1/namespaces/NS/usage, /v1/namespaces/NS/quota, /v1/upkeep/sweep, /v1/upkeep/scrub, /metrics)", r.Method, clip(r.URL.Path))
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
	s.usages.close()
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
		ReadHeaderTimeout: s.readHeader,
		IdleTimeout:       s.idle,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ConnContext:       s.connContext,
	}
	stop := make(chan struct{})
	go s.expireLoop(stop)
	defer s.watch(reqCtx)() // the change feed and the token file, until Serve returns
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
			s.metrics.requests.WithLabelValues(name, strconv.Itoa(sw.status)).Inc()
		}()
		var err error
		var c *Caller
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
		default:
			if c, err = s.identify(r); err != nil {
				sw.Header().Set("WWW-Authenticate", `Bearer realm="alkblobfs"`)
				break
			}
			// Checked first: the arguments alone cost allocations per
			// request when debug logging is off.
			if s.log.Enabled(r.Context(), slog.LevelDebug) {
				s.log.Debug("http request", "route", name, "method", r.Method, "path", r.URL.Path, "uid", c.UID)
			}
			err = h(sw, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
		}
		if err == nil {
			return
		}
		status, kind, msg := answer(err, r)
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
			writeJSON(sw, status, errorBody{Error: msg, Code: kind})
		}
	})
}

var errShuttingDown = &httpError{http.StatusServiceUnavailable, wire.CodeUnavailable, "the server is shutting down"}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func first(gids []uint32) *uint32 {
	if len(gids) == 0 {
		return nil
	}
	return &gids[0]
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
