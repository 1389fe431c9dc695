package ops

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// Every route decides with the caller by namespaces.Allowed, the rule the
// mount's kernel applies to a namespace's directory:
//
//	GET/HEAD ?namespace=NS, have      search (x) on NS            verb read
//	GET/HEAD without a namespace      root; anyone else: search on a namespace that links the digest
//	put                               write+search (wx) on NS     verb write
//	DELETE ?namespace=NS (unlink)     write+search on NS, as rm   verb delete
//	DELETE without a namespace        root or the server's owner, as alkblobfs rm
//	DELETE /v1/pins/T, renewal        the token's minter (or root)
//	GET /v1/namespaces/NS/usage       search on NS                verb read
//	PUT, DELETE /v1/namespaces/NS/quota  root or the server's owner, not bound to namespaces (namespaces.AllowedQuota)  verb sweep
//	/metrics                          anyone the server accepts (counts only); a namespace's
//	                                  usage series only for the namespaces the caller may search

// perm is namespace ns's Perm as the mount shows it: the recorded one, or
// for a namespace made without one the server's owner and 0755.
// ErrNotFound (404) if there is no such namespace.
//
// Perms are cached for PermTTL (250 ms by default, under the 400 ms in
// which a chmod through one mount shows on another), so that a burst of
// reads asks the registry once. A registry with a change feed (PostgreSQL)
// drops an entry as soon as a chmod, chown, removal or re-creation of its
// namespace by any process or host reaches the server (watchPerms); PermTTL
// is the bound without one (SQLite), and the backstop for changes a feed
// that was down missed.
func (s *Server) perm(ctx context.Context, ns string) (namespaces.Perm, error) {
	now := time.Now()
	var gen uint64
	if s.permTTL > 0 {
		s.permMu.Lock()
		e, ok := s.perms[ns]
		gen = s.permGen
		s.permMu.Unlock()
		if ok && now.Sub(e.at) < s.permTTL {
			return e.p, nil
		}
	}
	p, ok, err := s.ns.Perm(ctx, ns)
	if err != nil {
		return p, noNamespace(ns, err)
	}
	if !ok {
		p = namespaces.Perm{Uid: s.owner.UID, Gid: s.owner.GIDs[0], Mode: 0o755}
	}
	if s.permTTL > 0 {
		s.permMu.Lock()
		// A change that arrived while the registry was asked may be newer
		// than what it answered: cache nothing then.
		if gen == s.permGen {
			if len(s.perms) >= maxPerms {
				clear(s.perms) // many namespaces: start again rather than grow
			}
			s.perms[ns] = permEntry{p, now}
		}
		s.permMu.Unlock()
	}
	return p, nil
}

// forgetPerms drops the cached Perm of namespace ns, or of every namespace
// for "", and makes every lookup under way cache nothing.
func (s *Server) forgetPerms(ns string) {
	s.permMu.Lock()
	s.permGen++
	if ns == "" {
		clear(s.perms)
	} else {
		delete(s.perms, ns)
	}
	s.permMu.Unlock()
}

// watchPerms consumes the registry's change feed, if it has one, until ctx
// ends: a namespace whose Perm changed, that was removed or (re)created
// elsewhere loses its cache entry, and a Resync (the feed connected,
// reconnected or fell behind) drops them all. It returns once the feed is
// subscribed to, or known to be absent; the returned stop ends it and
// waits for it.
//
// SQLite's registry has no feed (namespaces.ErrNoFeed: its writers share
// one host and no notification channel), so there PermTTL alone bounds how
// long a chmod takes to be enforced.
func (s *Server) watchPerms(ctx context.Context) (stop func()) {
	w, ok := s.registry().(namespaces.Watcher)
	if !ok || s.permTTL == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	ch, err := w.Watch(ctx)
	if err != nil {
		cancel()
		if !errors.Is(err, namespaces.ErrNoFeed) {
			s.log.Warn("no change feed from the namespace registry: a chmod elsewhere is enforced over HTTP once the permission cache expires", "perm_cache", s.permTTL, "err", err)
		}
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			switch c.Kind {
			case namespaces.PermChanged, namespaces.Removed, namespaces.Created:
				s.forgetPerms(c.Namespace)
			case namespaces.Resync:
				s.forgetPerms("")
			}
		}
	}()
	return func() { cancel(); <-done }
}

// registry is the namespaces' registry, nil for a server without.
func (s *Server) registry() namespaces.Registry {
	if s.ns == nil {
		return nil
	}
	return s.ns.Registry
}

// watch starts what keeps the server's caches current while it serves:
// the namespaces' change feed (watchPerms) and the token file's rereads
// (watchTokenFile). The returned stop ends both and waits for them.
func (s *Server) watch(ctx context.Context) (stop func()) {
	perms := s.watchPerms(ctx)
	toks := s.watchTokenFile(ctx)
	return func() { perms(); toks() }
}

type permEntry struct {
	p  namespaces.Perm
	at time.Time
}

// maxPerms bounds the perm cache.
const maxPerms = 10000

// allow checks that c may use verb on namespace ns with access want: the
// token's verbs and namespaces first (so that a token bound elsewhere
// learns nothing, not even whether ns exists), then the namespace's Perm.
func (s *Server) allow(ctx context.Context, c *Caller, ns string, v Verb, want namespaces.Access) error {
	if err := c.may(v); err != nil {
		return err
	}
	if err := s.checkNamespace(ns); err != nil {
		return err
	}
	if !c.bound(ns) {
		return forbidden("namespace %q: this token is bound to other namespaces", ns)
	}
	p, err := s.perm(ctx, ns)
	if err != nil {
		return err
	}
	if namespaces.Allowed(p, c.Principal, want) != nil {
		return forbidden("namespace %q: permission denied (needs %s)", ns, want)
	}
	return nil
}

// readableLink is the first namespace c may search that links d, for a
// digest read that names none: the mount has no other path to a blob.
// It asks each namespace in turn (its Perm, then whether it links d), so
// it costs a lookup per namespace: a client that knows the namespace
// names it.
func (s *Server) readableLink(ctx context.Context, c *Caller, d store.Digest) (bool, error) {
	try := func(ns string) (bool, error) {
		p, err := s.perm(ctx, ns)
		if err != nil || namespaces.Allowed(p, c.Principal, namespaces.Search) != nil {
			return false, nil // gone meanwhile, or not c's to search
		}
		_, ok, err := s.ns.Has(ctx, ns, d)
		if err != nil {
			return false, noNamespace(ns, err)
		}
		return ok, nil
	}
	if c.Namespaces != nil {
		for _, ns := range c.Namespaces {
			if ok, err := try(ns); ok || err != nil {
				return ok, err
			}
		}
		return false, nil
	}
	for ns, err := range s.ns.Names(ctx, "") {
		if err != nil {
			return false, err
		}
		if ok, err := try(ns); ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}

// acquire takes n bytes of the memory budget for uid: first of uid's
// share, so that a principal waiting for its own share holds none of the
// rest, then of the whole. The returned func gives both back.
func (s *Server) acquire(ctx context.Context, uid uint32, n int64) (func(), error) {
	s.sharesM.Lock()
	sh, ok := s.shares[uid]
	if !ok {
		sh = semaphore.NewWeighted(s.share)
		s.shares[uid] = sh
	}
	s.sharesM.Unlock()
	if err := sh.Acquire(ctx, n); err != nil {
		return nil, err
	}
	if err := s.mem.Acquire(ctx, n); err != nil {
		sh.Release(n)
		return nil, err
	}
	s.held.Add(n)
	return func() { s.held.Add(-n); s.mem.Release(n); sh.Release(n) }, nil
}

// MemoryHeld is the part of the memory budget requests hold now (bytes).
func (s *Server) MemoryHeld() int64 { return s.held.Load() }

// deadlineReader sets a read deadline before each read of a request body:
// a client that sends nothing for d is cut (the read fails), and whatever
// the request held is given back.
//
// At the body's end the deadline is cleared: the server's own read of the
// connection after it (which watches for the client hanging up) must not
// time out while the handler still works. After a failed read it stays,
// so that the server, discarding the rest of the body, gives up too.
type deadlineReader struct {
	r  io.Reader
	rc *http.ResponseController
	d  time.Duration
}

func (b *deadlineReader) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(time.Now().Add(b.d))
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// deadlineWriter sets a write deadline before each write of an answer: a
// client that reads nothing for d is cut.
type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
	d  time.Duration
}

func (b *deadlineWriter) Write(p []byte) (int, error) {
	b.rc.SetWriteDeadline(time.Now().Add(b.d))
	return b.w.Write(p)
}

// (net/http clears both deadlines once a request is answered.)
