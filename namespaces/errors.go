package namespaces

import (
	"errors"
	"strconv"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Sentinel errors of the registry (the first three are meta's, whose
// statements find them, under the registry's names). Every error meaning one of these wraps it
// in an *Error naming the operation and the namespace; match with errors.Is.
// A reference that is not there (Unlink) wraps blob.ErrMissing, as does a
// Service link of a digest that is not in the pool.
var (
	// ErrExists: Create of a namespace that already exists.
	ErrExists = meta.ErrNSExists
	// ErrNotEmpty: Remove of a namespace that still holds references.
	ErrNotEmpty = meta.ErrNSNotEmpty
	// ErrNotFound: the namespace does not exist.
	ErrNotFound = meta.ErrNSNotFound
	// ErrBadName: the name breaks the rules of ValidName.
	ErrBadName = errors.New("bad namespace name")
)

// Error wraps a sentinel or an I/O failure with where it happened. Its
// message reads `op "namespace" digest: err`.
type Error struct {
	Op        string      // "create", "remove", "link", "unlink", "entries", ...
	Namespace string      // "" when not namespace-specific (IsLive, Live)
	Digest    blob.Digest // zero when not digest-specific
	Err       error
}

func (e *Error) Error() string {
	s := "namespaces: " + e.Op
	if e.Namespace != "" {
		n := e.Namespace
		if len(n) > 80 { // a bad name may be arbitrarily long
			n = n[:80] + "…"
		}
		s += " " + strconv.Quote(n)
	}
	if !e.Digest.IsZero() {
		s += " " + e.Digest.String()
	}
	return s + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// wrap returns err in an *Error, or nil when err is nil. An error that is
// already an *Error is returned as is, so helpers can wrap freely.
func wrap(op, name string, d blob.Digest, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Op: op, Namespace: name, Digest: d, Err: err}
}
