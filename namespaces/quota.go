package namespaces

import (
	"fmt"

	"github.com/alkblobfs/alkblobfs/meta"
)

// Quota is a namespace's limit: at most Bytes logical bytes and Blobs
// distinct digests, linked or pending. Zero means no limit on that
// measure; the zero Quota is none at all. It is meta's type, whose
// statements apply it where the rows change (meta.Quota.Fits); this
// package decides it.
type Quota = meta.Quota

// Usage is what a namespace holds, kept exactly by the registry (not
// estimated): see meta.Usage.
type Usage = meta.Usage

// UniqueUsage is the part of a namespace's Usage that no other namespace
// links or pends: what removing the namespace would let sweeps free
// (Registry.Unique; see meta.UniqueUsage).
type UniqueUsage = meta.UniqueUsage

// Count says n of unit, for the messages that print usage: "1 blob",
// "0 blobs", "4096 bytes" (unit is the singular; its plural adds an s).
func Count(n int64, unit string) string { return meta.Count(n, unit) }

// Sized is a digest with its blob's logical size, which a link charges to
// the namespace's usage.
type Sized = meta.Sized

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
