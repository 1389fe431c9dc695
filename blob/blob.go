// Package blob holds the two things every layer of alkblobfs shares: the
// content address ([Digest]) and the sentinel errors. It is a leaf package so
// that engines, gc, namespaces, store and fusefs can all name the same key
// type and match the same errors with errors.Is without importing each other.
//
// Inside this module every package names them from here (blob.Digest,
// blob.ErrMissing). The store package re-exports them as aliases (the same
// types and values) only so that a program outside the module that uses
// the store needs no second import.
package blob

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// Size is the length of a digest in bytes.
const Size = sha256.Size

// Digest is the sha256 of a blob's content: its key in the pool, and its file
// name on the mount (so `sha256sum` of a file equals its name).
type Digest [Size]byte

// Sentinel errors. Every error returned by alkblobfs packages that means one
// of these wraps it, with the operation, engine and digest as context; match
// with errors.Is, never by string.
var (
	// ErrMissing: the key is not in the pool (or not in this engine).
	ErrMissing = errors.New("blob missing")
	// ErrKeyInvalid: a key is not 64 lowercase-or-uppercase hex digits.
	ErrKeyInvalid = errors.New("invalid digest")
	// ErrVerification: content does not hash to its key (put or read).
	ErrVerification = errors.New("content does not match digest")
	// ErrTooLarge: the blob does not fit the tiers this store has.
	ErrTooLarge = errors.New("blob too large for this store")
	// ErrGcRefuse: a direct delete of a key that liveness protects.
	ErrGcRefuse = errors.New("refused: blob is protected by liveness")
	// ErrClosed: the store or engine has been closed.
	ErrClosed = errors.New("store closed")
	// ErrReadOnly: the store was opened on read-only media (its data
	// directory is on a read-only filesystem, or not writable by this
	// user): reads work, writes fail with this.
	ErrReadOnly = errors.New("store is read-only")
	// ErrNoSpace: the medium under an engine is full (a database that
	// cannot grow, a full disk). Nothing was stored; the same put works
	// once space is freed.
	ErrNoSpace = errors.New("no space left in the store")
	// ErrCorrupt: the store knows the blob to be corrupt (a scrub found
	// that its content does not match its digest) and refuses it before
	// serving a byte, until the right content is put again or its file is
	// restored. Errors wrapping it wrap ErrVerification too.
	ErrCorrupt = errors.New("blob is known corrupt")
	// ErrQuota: a link into a namespace would take it over its quota
	// (bytes or blobs). Nothing was linked, and whatever the link was to
	// publish with it (a put's entry in the same transaction) was not
	// published. A mount answers EDQUOT, HTTP 507.
	ErrQuota = errors.New("namespace quota exceeded")
	// ErrCorruptRow: a stored key is not 32 bytes (FromBytes).
	ErrCorruptRow = errors.New("corrupt row")
	// ErrLost: a namespace (a liveness source) links the blob but no tier
	// holds its content: it went behind the store's back (a file removed
	// by hand), as no sweep deletes a live blob. It matches ErrCorrupt and
	// ErrVerification too, so every surface refuses it as a corrupt blob
	// (EIO, HTTP 500 "corrupt"), never as an absent one, until the
	// content is put again.
	ErrLost error = lostError{}
)

type lostError struct{}

func (lostError) Error() string {
	return "blob is lost: a namespace links it but no tier holds its content"
}

func (lostError) Is(target error) bool { return target == ErrCorrupt || target == ErrVerification }

// Sum returns the digest of b.
func Sum(b []byte) Digest { return sha256.Sum256(b) }

// Parse parses 64 hex digits (either case) into a Digest. Anything else is an
// error wrapping ErrKeyInvalid.
func Parse(s string) (Digest, error) {
	var d Digest
	if len(s) != 2*Size {
		return d, fmt.Errorf("%w: %q: want %d hex digits, got %d characters", ErrKeyInvalid, truncate(s), 2*Size, len(s))
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return Digest{}, fmt.Errorf("%w: %q: not hex", ErrKeyInvalid, truncate(s))
	}
	return d, nil
}

// FromBytes converts a stored 32-byte key (a database column) to a Digest.
// Any other length is a corrupt row: an error (deliberately not
// ErrKeyInvalid, which means bad input from a caller), never some other
// digest.
func FromBytes(b []byte) (Digest, error) {
	var d Digest
	if len(b) != Size {
		return d, fmt.Errorf("%w: stored key of %d bytes, want %d", ErrCorruptRow, len(b), Size)
	}
	copy(d[:], b)
	return d, nil
}

// MustParse is Parse for constants in tests; it panics on a bad key.
func MustParse(s string) Digest {
	d, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return d
}

// IsDigestName reports whether s is exactly a canonical (lowercase) digest
// string — the only spelling the mount shows and accepts as a file name.
func IsDigestName(s string) bool {
	if len(s) != 2*Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// String is the lowercase hex form.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// Short is the first 12 hex digits, for log lines.
func (d Digest) Short() string { return hex.EncodeToString(d[:6]) }

// IsZero reports whether d is the zero value (not a valid content address of
// anything a caller would have meant).
func (d Digest) IsZero() bool { return d == Digest{} }

// Compare orders digests bytewise, which is also their hex string order.
func (d Digest) Compare(o Digest) int {
	for i := range d {
		if d[i] != o[i] {
			if d[i] < o[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// MarshalText and UnmarshalText make Digest a hex string in JSON.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d *Digest) UnmarshalText(b []byte) error {
	p, err := Parse(string(b))
	if err != nil {
		return err
	}
	*d = p
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Error wraps a sentinel or an I/O failure with where it happened. Its
// message reads "op engine digest: err".
type Error struct {
	Op     string // "put", "get", "read", "delete", "stage", "commit", "list"...
	Engine string // engine name, "" when not engine-specific
	Digest Digest // zero when not key-specific
	Err    error
}

func (e *Error) Error() string {
	s := e.Op
	if e.Engine != "" {
		s += " " + e.Engine
	}
	if !e.Digest.IsZero() {
		s += " " + e.Digest.String()
	}
	return s + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Wrap returns err wrapped in an *Error, or nil when err is nil.
func Wrap(op, engine string, d Digest, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Engine: engine, Digest: d, Err: err}
}
