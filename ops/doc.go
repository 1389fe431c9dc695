// Package ops is the HTTP surface of a store, beside or without a mount:
// remote puts with pin tokens, existence probes and token renewal, ranged
// reads that carry the digest of the bytes they return, and Prometheus
// metrics.
//
//	POST   /v1/blobs?namespace=NS   body: the blob → 201 {"token", "digest"}
//	POST   /v1/blobs/have           {"namespace", "digests": […], "token"?} → {"present": […]}
//	GET    /v1/blobs/{digest}       [?namespace=NS], Range, If-None-Match; HEAD too
//	DELETE /v1/blobs/{digest}       [?namespace=NS: unlink] delete now unless live (409) → 204
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
// # Who may call
//
// Every request is a Caller: the peer of a Unix socket (SO_PEERCRED, its
// groups from the passwd and group databases), the user a bearer token of
// the token file stands for (narrowed to the token's namespaces and
// verbs), or, with InsecureLoopback, the server's owner. Every route
// decides with namespaces.Allowed, the mount's rule (access.go has the
// table). Listen refuses a TCP listener without tokens, loopback included,
// unless InsecureLoopback; tokens are compared in constant time and never
// logged.
//
// # Errors
//
// Errors are wire.ErrorResponse, {"error": "…", "code": "…"}: the message
// names only the request's inputs (an error of the store is answered by
// its code alone; the log has it), the code is one of wire.Code*. The
// statuses are wire's table.
//
// # Bounds
//
// ReadHeaderTimeout (10 s), a deadline per read of a body and per write of
// an answer (BodyTimeout, 30 s), IdleTimeout (120 s); MaxTokens live pin
// tokens per principal (429 past it); MemoryShare of the memory budget per
// principal.
package ops
