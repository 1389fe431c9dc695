package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// defaultListen is serve's address when --listen is not given.
const defaultListen = "127.0.0.1:8437"

const httpHelp = `  POST   /v1/blobs?namespace=NS   store the body, link it into NS; answers
                                  {"token", "digest"}: the token pins the blob
  POST   /v1/blobs/have           {"namespace", "digests": [...], "token"?}:
                                  which digests NS holds; with a token (and one
                                  digest) renews the token's pin
  GET    /v1/blobs/DIGEST         the blob (Range, If-None-Match, HEAD); every
                                  answer carries Repr-Digest, the sha256 of
                                  the bytes it returns
  DELETE /v1/blobs/DIGEST         delete now, unless something keeps it (409)
  DELETE /v1/pins/TOKEN           release a put's pin
  GET    /metrics                 Prometheus metrics

A put's pin keeps its blob through sweeps until it is released, or until
--token-ttl after the put or its last renewal. Tokens live in the server's
memory: a restarted server has none, and a putter whose renewal answers
false puts the content again.

An address that is not loopback is refused unless --auth-token-file names
a bearer token; with one, every request must carry "Authorization: Bearer
TOKEN".`

func newServeCmd(a *app) *cobra.Command {
	var (
		listen   string
		tokenTTL time.Duration
		sched    upkeepFlags
	)
	cmd := &cobra.Command{
		Use:   "serve [--listen ADDR]",
		Short: "Serve the store over HTTP: remote puts with pin tokens, reads, metrics",
		Long: `serve answers HTTP requests for the store at --listen (default ` + defaultListen + `)
until interrupted (SIGINT, SIGTERM):

` + httpHelp + `

Nothing collects garbage unless asked: --sweep-every sweeps on a timer, as
alkblobfs sweep does by hand (a blob goes once no namespace links it and no
pin token holds it). --scrub-every re-reads every blob from disk on a timer,
at most --scrub-rate MB/s, and logs each one it finds corrupt or unreadable;
a corrupt one is refused from then on (500), here and by every process that
opens the store, until the right content is put again. Both stop when the
server does.

mount --listen serves the same requests beside a mount, with the mount's
counters added to the metrics.`,
		Example: `  alkblobfs serve
  alkblobfs serve --listen 0.0.0.0:8437 --auth-token-file /etc/alkblobfs/token
  alkblobfs serve --sweep-every 1h --scrub-every 24h
  curl --data-binary @app.tar 'http://127.0.0.1:8437/v1/blobs?namespace=builds'`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tokenTTL <= 0 {
				return usagef(cmd, "--token-ttl %s: must be positive", tokenTTL)
			}
			// Read-only is known once the store is open: upkeep.New
			// checks the sweep timer against it then.
			rate, err := sched.check(cmd, false)
			if err != nil {
				return err
			}
			ln, tok, err := a.listen(cmd, listen)
			if err != nil {
				return err
			}
			defer ln.Close()
			st, svc, err := a.openNS(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			lg := a.log
			if f := cmd.Flag("log-level"); f == nil || !f.Changed {
				lg = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			}
			u, err := upkeep.New(upkeep.Config{
				Store: st, Logger: lg, SweepEvery: sched.sweepEvery, ReadOnly: st.ReadOnly(),
				ScrubEvery: sched.scrubEvery, ScrubRate: rate,
			})
			if err != nil {
				return usagef(cmd, "--sweep-every: %v", err)
			}
			oc := a.opsConfig(st, svc, tok, tokenTTL, lg)
			oc.Metrics = ops.NewMetrics(st)
			oc.Metrics.AttachUpkeep(u)
			srv := ops.New(oc)
			lg.Info("serving", "url", "http://"+ln.Addr().String(), "auth", tok != "", "token_ttl", tokenTTL,
				"sweep_every", sched.sweepEvery, "scrub_every", sched.scrubEvery)
			u.Start()
			// Before the store closes: a timer's sweep or scrub ends first.
			defer u.Stop()
			if err := srv.Serve(cmd.Context(), ln); err != nil {
				return err
			}
			u.Stop()
			return st.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", defaultListen, "`ADDR` to listen on, HOST:PORT")
	cmd.Flags().DurationVar(&tokenTTL, "token-ttl", ops.DefaultTokenTTL, "life of a put's pin token after the put or its last renewal")
	sched.register(cmd.Flags(), "")
	return cmd
}

// listen opens addr for the HTTP surface, with the auth token from
// --auth-token-file. A non-loopback address without one is a usage error.
func (a *app) listen(cmd *cobra.Command, addr string) (net.Listener, string, error) {
	tok := ""
	if a.tokenFile != "" {
		t, err := ops.ReadAuthToken(a.tokenFile)
		if err != nil {
			return nil, "", usage(cmd, err)
		}
		tok = t
	}
	ln, err := ops.Listen(addr, tok)
	if errors.Is(err, ops.ErrNeedsAuth) {
		return nil, "", usage(cmd, err)
	}
	if err != nil {
		return nil, "", fmt.Errorf("--listen: %w", err)
	}
	return ln, tok, nil
}

// opsConfig is the HTTP surface's configuration for st from the global
// flags (the memory budget is --upload-memory's).
func (a *app) opsConfig(st *store.Store, svc *namespaces.Service, tok string, ttl time.Duration, lg *slog.Logger) ops.Config {
	return ops.Config{Store: st, Namespaces: svc, AuthToken: tok, TokenTTL: ttl, Memory: int64(a.uploadMem), Logger: lg}
}

// serveBeside runs srv on ln until the returned stop is called; stop
// waits for the server to finish (and may be called again).
func serveBeside(ctx context.Context, srv *ops.Server, ln net.Listener, lg *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, ln); err != nil {
			lg.Error("the HTTP server stopped", "err", err)
		}
	}()
	return sync.OnceFunc(func() {
		cancel()
		<-done
	})
}
