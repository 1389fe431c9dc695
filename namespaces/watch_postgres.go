package namespaces

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// listener is a kv engine that LISTENs on a connection of its own
// (engines/postgres.Engine.Listen).
type listener interface {
	Listen(ctx context.Context, channel string, ready func(), note func(payload string)) error
}

var _ Watcher = (*SQL)(nil)

// watchOpen readies Watch on PostgreSQL: an origin, random per registry,
// which meta's statements put in each notification of a change they
// commit (see meta.NSNotifyChannel), so that Watch can leave out the registry's own
// changes.
func (r *SQL) watchOpen(e engines.SQL) {
	if e.Dialect() != "postgres" {
		return
	}
	r.listen, _ = e.(listener)
	var b [8]byte
	rand.Read(b[:])
	r.origin = hex.EncodeToString(b[:])
}

// Watch implements Watcher on PostgreSQL: one listener on a connection of
// its own, reconnecting with backoff (listenBackoff) after a failure; a
// Resync follows every connection, carrying the error that ended the last
// one. Elsewhere (SQLite, whose processes share one host and no feed) it
// returns ErrNoFeed.
func (r *SQL) Watch(ctx context.Context) (<-chan Change, error) {
	if r.listen == nil {
		return nil, fmt.Errorf("namespaces: watch %s registry: %w", r.Dialect(), ErrNoFeed)
	}
	f := newFeed(ctx)
	go r.listenLoop(ctx, f)
	return f.out, nil
}

// listenBackoff bounds the wait between listener connections: it starts
// at the first and doubles up to the second, and starts over once a
// connection has listened for listenSteady.
//
// The cap is what a mount may lag behind the other hosts once the server
// is back after an outage: no change reaches it before its listener
// reconnects, and the Resync that follows. It was 10 s, so an outage of
// over 13 s left every host's kernel caches stale for up to 10 s after
// the server came back (TestFleetResyncAfterOutage). A failed attempt
// costs one dial, refused at once by a host whose server is down (a
// silent one waits the connect timeout instead, so the cap adds nothing
// there): two a second per host is nothing to a server.
var (
	listenBackoff = [2]time.Duration{50 * time.Millisecond, 500 * time.Millisecond}
	listenSteady  = time.Minute
)

func (r *SQL) listenLoop(ctx context.Context, f *feed) {
	wait := listenBackoff[0]
	var lastErr error
	for ctx.Err() == nil {
		var since time.Time
		err := r.listen.Listen(ctx, meta.NSNotifyChannel, func() {
			since = time.Now()
			f.push(Change{Kind: Resync, Err: lastErr})
		}, func(payload string) {
			if c, ok := r.parseNote(payload); ok {
				f.push(c)
			}
		})
		if err == nil || ctx.Err() != nil {
			return
		}
		lastErr = err
		if !since.IsZero() && time.Since(since) >= listenSteady {
			wait = listenBackoff[0]
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		wait = min(2*wait, listenBackoff[1])
	}
}

// parseNote reads a payload (meta.NSNotifyChannel). Its own changes and unknown
// kinds report nothing; a payload it cannot read reports a Resync, since
// some change went by unread.
func (r *SQL) parseNote(payload string) (Change, bool) {
	f := strings.Fields(payload)
	if len(f) < 3 {
		return Change{Kind: Resync, Err: fmt.Errorf("unreadable notification %q", payload)}, true
	}
	if f[1] == r.origin {
		return Change{}, false
	}
	c := Change{Namespace: f[2]}
	switch f[0] {
	case "c":
		c.Kind = Created
	case "p":
		c.Kind = PermChanged
	case "r":
		c.Kind = Removed
	case "u":
		d, err := blob.Parse(strings.Join(f[3:], ""))
		if len(f) != 4 || err != nil {
			return Change{Kind: Resync, Err: fmt.Errorf("unreadable notification %q", payload)}, true
		}
		c.Kind, c.Digest = Unlinked, d
	default:
		return Change{}, false
	}
	return c, true
}
