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
// Its msg is built by ops from the request's own inputs, and is what the
// client reads.
type httpError struct {
	status int
	kind   string // the metrics label and the answer's code (wire.Code*)
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, "bad_request", fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &httpError{http.StatusNotFound, "not_found", fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) error {
	return &httpError{http.StatusForbidden, wire.CodeForbidden, fmt.Sprintf(format, args...)}
}

// answer is the status, code and message err is answered with. An
// httpError's message is ops' own, naming the request's inputs; any other
// error (the store's, an engine's) is answered with its code's message
// alone, since its text may name server paths, engine URLs or other
// namespaces: the server's log has it whole.
func answer(err error, r *http.Request) (status int, code, msg string) {
	status, code = classify(err)
	var he *httpError
	if errors.As(err, &he) {
		return status, code, he.msg
	}
	return status, code, publicMessage(code, r)
}

// publicMessage is the message of an error answered by its code alone.
func publicMessage(code string, r *http.Request) string {
	subject := clip(r.PathValue("digest"))
	if subject == "" {
		subject = "the request"
	}
	switch code {
	case wire.CodeBadRequest:
		return "bad input: a malformed digest or namespace name"
	case wire.CodeNotFound:
		return "not found: " + subject
	case wire.CodeRefused:
		return subject + " is live (a namespace links it or a pin holds it): nothing was deleted"
	case wire.CodeTooLarge:
		return "the blob is over this store's size limit: nothing was stored"
	case wire.CodeCorrupt:
		return subject + ": the server's copy is known corrupt; put the content again"
	case wire.CodeVerification:
		return "the content does not match the digest claimed for it: nothing was stored"
	case wire.CodeNoSpace:
		return "the store is full: nothing was stored"
	case wire.CodeQuota:
		return "the namespace is at its quota: nothing was linked"
	case wire.CodeReadOnly:
		return "the store is read-only"
	case wire.CodeForbidden:
		return "permission denied"
	}
	if r.Context().Err() != nil {
		return "the request was canceled"
	}
	return "the store failed to answer; try again (the server's log has the cause)"
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
	case errors.Is(err, blob.ErrQuota):
		// Before ErrNoSpace: the namespace is full, not the store.
		return http.StatusInsufficientStorage, wire.CodeQuota
	case errors.Is(err, blob.ErrNoSpace):
		return http.StatusInsufficientStorage, "no_space"
	case errors.Is(err, blob.ErrReadOnly):
		return http.StatusForbidden, "read_only"
	case errors.Is(err, namespaces.ErrDenied), errors.Is(err, namespaces.ErrNotOwner):
		return http.StatusForbidden, wire.CodeForbidden
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
