package namespaces

import (
	"fmt"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Quota is a namespace's limit: at most Bytes logical bytes and Blobs
// distinct digests, linked or pending. Zero means no limit on that
// measure; the zero Quota is none at all.
type Quota struct {
	Bytes, Blobs int64
}

// check refuses a negative limit.
func (q Quota) check() error {
	if q.Bytes < 0 || q.Blobs < 0 {
		return fmt.Errorf("negative quota (%d bytes, %d blobs); 0 means no limit", q.Bytes, q.Blobs)
	}
	return nil
}

// fits reports whether usage of blobs and bytes is within q.
func (q Quota) fits(blobs, bytes int64) bool {
	return (q.Blobs <= 0 || blobs <= q.Blobs) && (q.Bytes <= 0 || bytes <= q.Bytes)
}

// Usage is what a namespace holds, kept exactly by the registry (not
// estimated): a digest counts once per namespace whether it is linked,
// pending (an intent, from the close that recorded it), or both; a digest
// in two namespaces counts in both. Reading it costs one row, whatever
// the namespace's size.
type Usage struct {
	// Blobs is the number of distinct digests the namespace links or
	// pends; Bytes their logical sizes' sum.
	Blobs, Bytes int64
	// Quota is the namespace's limit (SetQuota); zero fields mean none.
	Quota Quota
}

// UniqueUsage is the part of a namespace's Usage that no other namespace
// links or pends: what removing the namespace would let sweeps free. It
// is computed when asked, from every reference and intent of the
// namespace (O(its rows)), not kept: a separate call
// (Registry.Unique) so that the surfaces that run often (df, /metrics,
// a refused put's message) never pay for it.
type UniqueUsage struct {
	Blobs, Bytes int64
}

// Count says n of unit, for the messages that print usage: "1 blob",
// "0 blobs", "4096 bytes" (unit is the singular; its plural adds an s).
func Count(n int64, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return fmt.Sprintf("%d %ss", n, unit)
}

// Sized is a digest with its blob's logical size, which a link charges to
// the namespace's usage.
type Sized struct {
	Digest blob.Digest
	Size   int64
}

// errQuota is the error of a link or pend refused for q: it wraps
// blob.ErrQuota and says which limit.
func errQuota(q Quota, u Usage, blobs, bytes int64) error {
	switch {
	case q.Blobs > 0 && u.Blobs+blobs > q.Blobs:
		return fmt.Errorf("%w: %s + %d over the limit of %d", blob.ErrQuota, Count(u.Blobs, "blob"), blobs, q.Blobs)
	case q.Bytes > 0 && u.Bytes+bytes > q.Bytes:
		return fmt.Errorf("%w: %s + %d over the limit of %d", blob.ErrQuota, Count(u.Bytes, "byte"), bytes, q.Bytes)
	}
	return blob.ErrQuota
}

// AllowedQuota returns nil if who may set or clear a namespace's quota,
// and an error wrapping ErrNotOwner otherwise: root, or the store's owner
// (storeOwner, the uid the store's files belong to, whom a mount runs
// as). A namespace's own owner may not raise its own limit. Every surface
// calls it before Registry.SetQuota.
func AllowedQuota(who Principal, storeOwner uint32) error {
	if who.UID == 0 || who.UID == storeOwner {
		return nil
	}
	return &Error{Op: fmt.Sprintf("set quota (uid %d is neither root nor the store's owner, uid %d)", who.UID, storeOwner), Err: ErrNotOwner}
}

// checkSize refuses a negative size: usage would run backwards.
func checkSize(size int64) error {
	if size < 0 {
		return fmt.Errorf("negative blob size %d", size)
	}
	return nil
}
