package wire

import (
	"errors"
	"fmt"
	"io/fs"
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

// Quota is a namespace's limits (PUT /v1/namespaces/NS/quota, and part of
// Usage). 0 is no limit.
type Quota struct {
	Bytes int64 `json:"bytes"`
	Blobs int64 `json:"blobs"`
}

// Usage is what a namespace links and may link: GET
// /v1/namespaces/NS/usage, and the answer to a quota change. Blobs and
// Bytes count every blob it links (a blob two namespaces link counts in
// both), counters the server reads as one row. Unique is what of it no
// other namespace links, what sweeps would free if it went: a query over
// all of the namespace's references, which only GET .../usage runs; the
// answer to a quota change leaves it out (nil).
type Usage struct {
	Namespace string  `json:"namespace"`
	Blobs     int64   `json:"blobs"`
	Bytes     int64   `json:"bytes"`
	Unique    *Unique `json:"unique,omitempty"`
	Quota     Quota   `json:"quota"`
}

// Unique is the part of a namespace's usage that no other namespace links
// (Usage.Unique).
type Unique struct {
	Blobs int64 `json:"blobs"`
	Bytes int64 `json:"bytes"`
}

// ErrorResponse is the body of every error answer. Error is for people:
// it names the request's own inputs (a digest, a namespace it asked for),
// never a server path, an engine URL or another namespace's contents.
// Code is for programs: one of the Code constants, stable across versions.
type ErrorResponse struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
}

// The error codes (ErrorResponse.Code). A client decides by these and the
// status, never by the message.
const (
	CodeBadRequest   = "bad_request"  // 400
	CodeUnauthorized = "unauthorized" // 401: no credentials, or a token the server does not know
	CodeForbidden    = "forbidden"    // 403: the caller may not do this (namespace mode, token binding)
	CodeReadOnly     = "read_only"    // 403: the server is read-only
	CodeNotFound     = "not_found"    // 404
	CodeRefused      = "refused"      // 409: a delete of a live blob
	CodeTooLarge     = "too_large"    // 413
	CodeBadRange     = "bad_range"    // 416
	CodeVerification = "verification" // 422
	CodeTooMany      = "too_many"     // 429: the caller's live pin tokens are at the bound
	CodeCorrupt      = "corrupt"      // 500: the stored copy is known corrupt
	CodeUnavailable  = "unavailable"  // 503: the backend failed, or the server is shutting down
	CodeNoSpace      = "no_space"     // 507: the store is full
	CodeQuota        = "quota"        // 507: the namespace's quota refuses the link
)

// ErrDenied is what a 403 with CodeForbidden stands for: the caller may
// not do this. It matches fs.ErrPermission.
var ErrDenied = fmt.Errorf("permission denied: %w", fs.ErrPermission)

// ErrTooMany is what a 429 stands for: too many live pin tokens.
var ErrTooMany = errors.New("too many live pin tokens")

// SentinelOf is the sentinel an error answer stands for, by its status
// and code: Sentinel's, except that a 403 is ErrDenied unless its code is
// CodeReadOnly, a 429 is ErrTooMany, and a 507 with CodeQuota is
// blob.ErrQuota (the namespace's quota, not the store, is full).
func SentinelOf(status int, code string) error {
	switch {
	case status == http.StatusForbidden && code != CodeReadOnly && code != "":
		return ErrDenied
	case status == http.StatusTooManyRequests:
		return ErrTooMany
	case status == http.StatusInsufficientStorage && code == CodeQuota:
		return blob.ErrQuota
	}
	return Sentinel(status)
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
