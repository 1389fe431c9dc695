package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// listenCheck is how long Listen waits for a notification before it
// checks that the connection still answers: a server or a network gone
// silent (no RST, no FIN) shows as an error within about listenCheck +
// listenPing, not as a wait forever.
const (
	listenCheck = 10 * time.Second
	listenPing  = 5 * time.Second
)

// Listen runs LISTEN channel on a connection of its own, outside the pool,
// as SweepLease does: a listener holds its connection for as long as it
// runs and must not take one of those that puts and lookups wait for.
// Once listening, it calls ready; then note with each notification's
// payload, in the order the server sends them (commit order), until ctx
// ends (it returns nil) or the connection fails (it returns the error;
// the caller reconnects). Notifications committed while no connection
// listened are lost: ready tells the caller when to assume so.
func (e *Engine) Listen(ctx context.Context, channel string, ready func(), note func(payload string)) error {
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		return e.wrapCtx(ctx, "listen", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), listenPing)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return e.wrapCtx(ctx, "listen", err)
	}
	ready()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenCheck)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			note(n.Payload)
			continue
		case ctx.Err() != nil:
			return nil
		case !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded):
			return e.wrap("listen", err)
		}
		pctx, cancel := context.WithTimeout(ctx, listenPing)
		_, err = conn.Exec(pctx, "SELECT 1")
		cancel()
		if err != nil {
			return e.wrapCtx(ctx, "listen", err)
		}
	}
}

// wrapCtx is wrap, or nil once ctx has ended (the caller stopped).
func (e *Engine) wrapCtx(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return e.wrap(op, err)
}
