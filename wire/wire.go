package wire

import (
	"net/http"

	"github.com/alkblobfs/alkblobfs/blob"
)

// MaxHave is the most digests one have request may ask about; the client
// splits longer lists.
const MaxHave = 10000

// PutResponse is the answer to a put: the blob's digest (hex) and the
// token of the pin that holds it. Both are always present.
type PutResponse struct {
	Token  string `json:"token"`
	Digest string `json:"digest"`
}

// HaveRequest asks which digests (hex) a namespace links, or, with Token,
// renews the token's pin on its one digest.
type HaveRequest struct {
	Namespace string   `json:"namespace"`
	Digests   []string `json:"digests"`
	Token     string   `json:"token,omitempty"`
}

// HaveResponse answers a HaveRequest: Present[i] is about Digests[i].
type HaveResponse struct {
	Present []bool `json:"present"`
}

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
}

// Sentinel is the blob sentinel an error status stands for (see the
// package doc), or nil for a status that stands for none.
func Sentinel(status int) error {
	switch status {
	case http.StatusForbidden:
		return blob.ErrReadOnly
	case http.StatusNotFound:
		return blob.ErrMissing
	case http.StatusConflict:
		return blob.ErrGcRefuse
	case http.StatusRequestEntityTooLarge:
		return blob.ErrTooLarge
	case http.StatusUnprocessableEntity:
		return blob.ErrVerification
	case http.StatusInsufficientStorage:
		return blob.ErrNoSpace
	}
	return nil
}
