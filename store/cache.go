package store

import (
	"context"
	"errors"

	"github.com/alkblobfs/alkblobfs/engines"
)

// The large tier's local cache (engines/cache), when the large engine is
// one: its counters for metrics and `alkblobfs cache stat`, and its
// operations. Every surface reads through it, since it is the store's
// large engine.

// CacheStats is the cache's state (engines.CacheStats).
type CacheStats = engines.CacheStats

// CacheCounters are a cache's counters (engines.CacheCounters).
type CacheCounters = engines.CacheCounters

// ErrNoCache: the store has no cache (no --cache, or a large tier that
// is not remote).
var ErrNoCache = errors.New("the store has no cache: give --cache DIR with an s3:// or pglo large tier")

func (s *Store) cache() (engines.Cache, error) {
	c, ok := s.large.(engines.Cache)
	if !ok || s.large == nil {
		return nil, ErrNoCache
	}
	return c, nil
}

// HasCache reports whether the large tier has a local cache.
func (s *Store) HasCache() bool { _, err := s.cache(); return err == nil }

// CacheStats reports the cache's size and counters; ErrNoCache without
// one.
func (s *Store) CacheStats(ctx context.Context) (CacheStats, error) {
	c, err := s.cache()
	if err != nil {
		return CacheStats{}, err
	}
	return c.CacheStats(ctx)
}

// CacheWarm fetches d into the cache (engines.Cache.Warm). A blob of the
// kv tier has nothing to warm: ok is false.
func (s *Store) CacheWarm(ctx context.Context, d Digest, progress func(done int64)) (ok bool, err error) {
	c, err := s.cache()
	if err != nil {
		return false, err
	}
	info, found, err := s.Stat(ctx, d)
	if err != nil {
		return false, err
	}
	if !found {
		return false, ErrMissing
	}
	if info.Tier != TierLarge {
		return false, nil
	}
	return true, c.Warm(ctx, d, progress)
}

// CacheDrop empties the cache of every copy no process of the host has
// open or is filling.
func (s *Store) CacheDrop(ctx context.Context) (blobs int, bytes int64, err error) {
	c, err := s.cache()
	if err != nil {
		return 0, 0, err
	}
	return c.DropAll(ctx)
}

// refetch asks a cache's cursor to drop the local copy that failed
// verification and read from the remote tier instead; it reports whether
// it did (the read may be tried again).
func (r *Reader) refetch() bool {
	rf, ok := r.cur.(engines.Refetcher)
	if !ok {
		return false
	}
	if err := rf.Refetch(); err != nil {
		r.s.log.Warn("a cached copy failed verification and the remote tier could not be read instead", "digest", r.d.String(), "err", err)
		return false
	}
	return true
}
