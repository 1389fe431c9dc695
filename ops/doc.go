// Package ops is the HTTP surface of a store, beside or without a mount:
// remote puts with pin tokens, existence probes and token renewal, ranged
// reads that carry the digest of the bytes they return, and Prometheus
// metrics.
//
//	POST   /v1/blobs?namespace=NS   body: the blob → 201 {"token", "digest"}
//	POST   /v1/blobs/have           {"namespace", "digests": […], "token"?} → {"present": […]}
//	GET    /v1/blobs/{digest}       [?namespace=NS], Range, If-None-Match; HEAD too
//	DELETE /v1/blobs/{digest}       delete now unless live (409) → 204
//	DELETE /v1/pins/{token}         release a put's pin → 204
//	GET    /metrics                 Prometheus text format
//
// # Pin tokens
//
// A put links the blob into its namespace and answers a token naming the
// pin that holds it (seeds ADR-010 §4, ADR-012 §2: the token is the pin).
// The pin keeps the blob through sweeps even if the namespace drops it,
// until the token is released or lapses: TTL (Config.TokenTTL, 60 s) after
// the put or its last renewal. A have carrying the token, with exactly
// that one digest, renews it and answers present=true; a lapsed or unknown
// token answers present=false, and the putter's backstop is to put again.
// Where the store keeps pin rows (SQLite, PostgreSQL, fleet mode), the pin
// protects the blob from sweeps of every process and host sharing the
// pool. Tokens live in the memory of the server that minted it: renewals
// must reach that server, and a restart ends them all.
//
// # Errors
//
// Errors are {"error": "…"}: 400 for bad input (a malformed digest,
// namespace, range or body), 401 without the bearer token, 404 for an
// absent blob, namespace or token, 409 for a refused delete, 413 for a blob
// over a kv-only store's threshold, 416 for a range past the end, 422 when
// the content does not match a claimed digest, 503 (with Retry-After) when
// the backend fails.
//
// # Exposure
//
// Listen refuses an address that is not loopback unless a bearer token is
// configured; with one, every request must carry it ("Authorization:
// Bearer T"), compared in constant time. The token is never logged.
package ops
