package store

import "github.com/alkblobfs/alkblobfs/blob"

// Digest is a blob's sha256, its key in the pool.
type Digest = blob.Digest

// ParseDigest parses 64 hex digits; anything else wraps ErrKeyInvalid.
func ParseDigest(s string) (Digest, error) { return blob.Parse(s) }

// The sentinel errors, shared with every layer (see package blob).
var (
	ErrMissing      = blob.ErrMissing
	ErrKeyInvalid   = blob.ErrKeyInvalid
	ErrVerification = blob.ErrVerification
	ErrTooLarge     = blob.ErrTooLarge
	ErrGcRefuse     = blob.ErrGcRefuse
	ErrClosed       = blob.ErrClosed
	ErrReadOnly     = blob.ErrReadOnly
	ErrCorrupt      = blob.ErrCorrupt
	ErrLost         = blob.ErrLost
	// ErrQuota: a put's link refused by its namespace's quota (the
	// commands say so without importing blob).
	ErrQuota = blob.ErrQuota
)
