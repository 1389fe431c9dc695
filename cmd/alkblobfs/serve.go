package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// defaultListen is serve's address when --listen is not given: the
// default Unix socket (ops.DefaultSocket).
const defaultListen = "unix:"

const httpHelp = `  POST   /v1/blobs?namespace=NS   store the body, link it into NS; answers
                                  {"token", "digest"}: the token pins the blob
  POST   /v1/blobs/have           {"namespace", "digests": [...], "token"?}:
                                  which digests NS holds; with a token (and one
                                  digest) renews the token's pin
  GET    /v1/blobs/DIGEST         the blob (Range, If-None-Match, HEAD); every
                                  answer carries Repr-Digest, the sha256 of
                                  the bytes it returns
  DELETE /v1/blobs/DIGEST         delete now, unless something keeps it (409);
                                  with ?namespace=NS drop NS's reference
  DELETE /v1/pins/TOKEN           release a put's pin
  GET    /metrics                 Prometheus metrics

A put's pin keeps its blob through sweeps until it is released, or until
--token-ttl after the put or its last renewal. Tokens live in the server's
memory: a restarted server has none, and a putter whose renewal answers
false puts the content again.

Who calls is a user, and every request gets what the mount would give that
user (a namespace's owner, group and mode; see "Who may do what" in
docs/security.md). --listen unix:PATH serves a Unix socket (mode 0666) where the kernel
says who each caller is; unix: alone is $XDG_RUNTIME_DIR/alkblobfs/http.sock,
or /run/alkblobfs/http.sock without XDG_RUNTIME_DIR. --listen HOST:PORT
serves TCP, loopback included, only with --auth-token-file FILE (mode 0600),
one token per line:

  TOKEN USER [namespaces=NS,...] [verbs=read,write,delete,sweep]

Every request then carries "Authorization: Bearer TOKEN" and acts as USER (a
uid or a user name), limited to the namespaces and verbs given. The server
rereads the file within a second of a change, and at once on SIGHUP: a
token removed from it is refused from then on, and a file that fails to
parse keeps the tokens read before (the log says why).
--insecure-loopback serves loopback without tokens instead: every local user
then acts as the server's own user (refused with mount --allow-other).`

func newServeCmd(a *app) *cobra.Command {
	var (
		listen   string
		insecure bool
		permTTL  time.Duration
		tokenTTL time.Duration
		sched    upkeepFlags
		cpuProf  string
		memProf  string
	)
	cmd := &cobra.Command{
		Use:         "serve [--listen ADDR]",
		Annotations: logDefault,
		Short:       "Serve the store over HTTP: remote puts with pin tokens, reads, metrics",
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
  alkblobfs serve --listen 0.0.0.0:8437 --auth-token-file /etc/alkblobfs/tokens
  alkblobfs serve --sweep-every 1h --scrub-every 24h
  curl --unix-socket /run/alkblobfs/http.sock --data-binary @app.tar 'http://x/v1/blobs?namespace=builds'`,
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
			ln, toks, err := a.listen(cmd, listen, insecure, false, false, nil)
			if err != nil {
				return err
			}
			defer ln.Close()
			st, svc, err := a.openNS(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			lg := a.log // at info unless asked otherwise (commandLogLevel)
			if svc != nil && !st.ReadOnly() {
				// As a mount's lease does: a writer that dies while this
				// server runs has its closed files published once its
				// lease lapses.
				defer svc.KeepSettling(st.PinTTL(), lg)()
				a.fillSizes(cmd.Context(), svc)
			}
			u, err := upkeep.New(upkeep.Config{
				Store: st, Logger: lg, SweepEvery: sched.sweepEvery, ReadOnly: st.ReadOnly(),
				ScrubEvery: sched.scrubEvery, ScrubRate: rate,
			})
			if err != nil {
				return usagef(cmd, "--sweep-every: %v", err)
			}
			oc := a.opsConfig(st, svc, toks, insecure, tokenTTL, lg)
			oc.Metrics = ops.NewMetrics(st)
			oc.PermTTL = permTTL
			oc.Metrics.AttachUpkeep(u)
			oc.Upkeep = u
			srv := ops.New(oc)
			if cpuProf != "" {
				stop, err := startCPUProfile(cpuProf)
				if err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				defer stop()
			}
			if memProf != "" {
				defer func() {
					if err := writeHeapProfile(memProf); err != nil {
						lg.Warn("--memprofile", "err", err)
					}
				}()
			}
			lg.Info("serving", "url", listenURL(ln), "tokens", toks.Len(), "token_ttl", tokenTTL,
				"sweep_every", sched.sweepEvery, "scrub_every", sched.scrubEvery)
			u.Start()
			// Before the store closes: a timer's sweep or scrub ends first.
			defer u.Stop()
			defer reloadOnHangup(cmd.Context(), toks, lg)()
			if err := srv.Serve(cmd.Context(), ln); err != nil {
				return err
			}
			u.Stop()
			return st.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", defaultListen, "`ADDR` to listen on: unix:PATH (unix: alone is the default socket, see above) or HOST:PORT (needs --auth-token-file)")
	cmd.Flags().BoolVar(&insecure, "insecure-loopback", false, "serve a loopback HOST:PORT without tokens: every local user acts as this server's user")
	cmd.Flags().DurationVar(&tokenTTL, "token-ttl", ops.DefaultTokenTTL, "life of a put's pin token after the put or its last renewal")
	permCacheFlag(cmd.Flags(), &permTTL)
	sched.register(cmd.Flags(), "")
	cmd.Flags().StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of the server to this file (for go tool pprof)")
	cmd.Flags().MarkHidden("cpuprofile")
	cmd.Flags().StringVar(&memProf, "memprofile", "", "write a heap profile (with every allocation counted: pprof -alloc_objects) to this file when the server stops")
	cmd.Flags().MarkHidden("memprofile")
	return cmd
}

// listen opens addr for the HTTP surface, with the tokens of
// --auth-token-file for a TCP address. A TCP address without them, or
// --insecure-loopback beside --allow-other, is a usage error. inherited,
// if not nil, is the listener a predecessor's upgrade passed on (its
// address is addr's): it is used instead of a new one.
func (a *app) listen(cmd *cobra.Command, addr string, insecure, allowOther, takeOver bool, inherited net.Listener) (net.Listener, *ops.Tokens, error) {
	if insecure && allowOther {
		return nil, nil, usagef(cmd, "--insecure-loopback with --allow-other: every local user would act as you over HTTP, whatever the namespaces' modes; serve them on the Unix socket (--listen unix:) or give --auth-token-file")
	}
	if addr == "unix:" {
		addr += ops.DefaultSocket()
	}
	var toks *ops.Tokens
	if a.tokenFile != "" && !strings.HasPrefix(addr, "unix:") {
		t, err := ops.ReadTokenFile(a.tokenFile)
		if err != nil {
			return nil, nil, usage(cmd, err)
		}
		toks = t
	}
	if inherited != nil {
		return inherited, toks, nil
	}
	ln, err := ops.Listen(addr, ops.ListenConfig{Tokens: toks != nil, InsecureLoopback: insecure, TakeOver: takeOver})
	if errors.Is(err, ops.ErrNeedsAuth) {
		return nil, nil, usage(cmd, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--listen: %w", err)
	}
	return ln, toks, nil
}

// reloadOnHangup rereads the token file on each SIGHUP until ctx ends or
// the returned stop is called (the server also rereads it once it
// changes, within ops.TokenCheckEvery). Without a token file SIGHUP is
// left alone.
func reloadOnHangup(ctx context.Context, toks *ops.Tokens, lg *slog.Logger) (stop func()) {
	if toks == nil {
		return func() {}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-hup:
				lg.Info("SIGHUP: rereading the token file")
				toks.Reload(lg) // logs what came of it
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { signal.Stop(hup); cancel(); <-done }
}

// listenURL is where clients reach ln: unix:PATH or http://HOST:PORT.
func listenURL(ln net.Listener) string {
	if ln.Addr().Network() == "unix" {
		return "unix:" + ln.Addr().String()
	}
	return "http://" + ln.Addr().String()
}

// opsConfig is the HTTP surface's configuration for st from the global
// flags (the memory budget is --upload-memory's).
func (a *app) opsConfig(st *store.Store, svc *namespaces.Service, toks *ops.Tokens, insecure bool, ttl time.Duration, lg *slog.Logger) ops.Config {
	return ops.Config{Store: st, Namespaces: svc, Tokens: toks, InsecureLoopback: insecure, TokenTTL: ttl, Memory: int64(a.uploadMem), Logger: lg}
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

// permCacheFlag registers the hidden --perm-cache: how long the HTTP
// surface caches a namespace's owner, group and mode (tests turn it off
// with a negative value to see a chmod at once).
func permCacheFlag(f *pflag.FlagSet, v *time.Duration) {
	f.DurationVar(v, "perm-cache", ops.DefaultPermTTL, "how long HTTP caches a namespace's owner, group and mode")
	f.MarkHidden("perm-cache")
}
