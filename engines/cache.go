package engines

import (
	"context"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Cache is implemented by a large engine that keeps local copies of a
// remote tier's blobs (engines/cache): the store reports its counters and
// offers its operations (warm, drop) to the surfaces.
type Cache interface {
	// CacheStats reports the cache's size and counters.
	CacheStats(ctx context.Context) (CacheStats, error)
	// Warm fetches d into the cache unless it is there; progress (may be
	// nil) is called with the bytes fetched so far.
	Warm(ctx context.Context, d blob.Digest, progress func(done int64)) error
	// DropAll removes every cached copy that no process of the host has
	// open or is filling, and reports what it removed.
	DropAll(ctx context.Context) (blobs int, bytes int64, err error)
}

// CacheCounters counts what a cache did.
type CacheCounters struct {
	Hits        int64 `json:"hits"`
	Misses      int64 `json:"misses"`
	Fills       int64 `json:"fills"`
	BytesFilled int64 `json:"bytes_filled"`
	Evictions   int64 `json:"evictions"`
	// Adopted counts puts whose verified file became the cached copy by
	// a hard link (write-through, no byte copied).
	Adopted int64 `json:"adopted"`
	// FillErrors counts fills given up, by cause: "remote" (the remote
	// tier failed), "nospace" (the cache's disk was full), "full"
	// (everything cached is open or filling), "verify" (the fetched
	// bytes did not hash to the digest), "local" (another local error).
	FillErrors map[string]int64 `json:"fill_errors"`
	// Dropped counts cached copies found corrupt and removed.
	Dropped int64 `json:"dropped_corrupt"`
}

// CacheStats is a cache's state: its size now, and its counters in this
// process and summed over every process of the host that used it.
type CacheStats struct {
	Dir     string        `json:"dir"`
	Limit   int64         `json:"limit_bytes"`
	Bytes   int64         `json:"bytes"`
	Blobs   int64         `json:"blobs"`
	Filling int           `json:"filling"`
	Process CacheCounters `json:"process"`
	Host    CacheCounters `json:"host"`
}

// Refetcher is implemented by a cache's cursor over a local copy: Refetch
// drops the copy (its bytes failed verification) and serves the rest of
// the cursor's reads from the remote tier, refilling the cache. Calls
// after the first do nothing.
type Refetcher interface {
	Refetch() error
}

type directKey struct{}

// Direct returns ctx marked so that a cache engine's Open reads the remote
// tier itself, neither serving nor filling a local copy (a scrub checks
// the pool, not this host's cache).
func Direct(ctx context.Context) context.Context { return context.WithValue(ctx, directKey{}, true) }

// IsDirect reports whether ctx was marked by Direct.
func IsDirect(ctx context.Context) bool { v, _ := ctx.Value(directKey{}).(bool); return v }
