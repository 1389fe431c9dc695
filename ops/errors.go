package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/wire"
)

// httpError is an error with the status and kind it is answered with.
type httpError struct {
	status int
	kind   string // the metrics label
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, "bad_request", fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &httpError{http.StatusNotFound, "not_found", fmt.Sprintf(format, args...)}
}

// classify maps an error to its status and kind. Errors of the store and the
// namespaces map by their sentinels; anything else is the backend failing
// (a database that cannot be reached, a disk that fails), answered 503 so
// that a client retries later.
func classify(err error) (status int, kind string) {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he.status, he.kind
	case errors.Is(err, blob.ErrKeyInvalid), errors.Is(err, namespaces.ErrBadName):
		return http.StatusBadRequest, "bad_request"
	case errors.Is(err, blob.ErrMissing), errors.Is(err, namespaces.ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, blob.ErrGcRefuse):
		return http.StatusConflict, "refused"
	case errors.Is(err, blob.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, blob.ErrCorrupt):
		// Before ErrVerification, which it wraps too: the stored copy is
		// bad (a scrub found it so), a fault of the server, not of the
		// request. The message names the digest, never a path.
		return http.StatusInternalServerError, "corrupt"
	case errors.Is(err, blob.ErrVerification):
		return http.StatusUnprocessableEntity, "verification"
	case errors.Is(err, blob.ErrNoSpace):
		return http.StatusInsufficientStorage, "no_space"
	case errors.Is(err, blob.ErrReadOnly):
		return http.StatusForbidden, "read_only"
	}
	return http.StatusServiceUnavailable, "unavailable"
}

// writeJSON answers v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) // a failed write is the client gone
}

type errorBody = wire.ErrorResponse
