// Package wire is the HTTP protocol of alkblobfs, written once: the JSON
// bodies, the digest field codec and the meaning of each status, shared by
// the server (ops) and the Go client (client). docs/http.md says the same
// for users, with examples.
//
// It is a package of its own, not a part of either side, because both
// sides must agree on every byte and neither should import the other: ops
// importing client to learn its own protocol made the server depend on a
// client, and a client importing ops would pull in the store. wire imports
// only blob (for Digest and the sentinels a status stands for), so either
// side, or a third (a proxy, a test), may use it without the rest.
//
// # Routes
//
//	POST   /v1/blobs?namespace=NS   body: the blob; Content-Digest etc. claim its digest
//	                                → 201 PutResponse, Location: /v1/blobs/DIGEST
//	POST   /v1/blobs/have           HaveRequest → 200 HaveResponse (a renewal with Token)
//	GET    /v1/blobs/DIGEST         [?namespace=NS], Range, If-None-Match → 200, 206, 304; HEAD too
//	                                Repr-Digest and Content-Digest: DigestField of the bytes sent
//	DELETE /v1/blobs/DIGEST         → 204 (409 while live)
//	DELETE /v1/pins/TOKEN           → 204
//	GET    /v1/namespaces/NS/usage  → 200 Usage
//	PUT    /v1/namespaces/NS/quota  Quota → 200 Usage (DELETE: clears it)
//	GET    /metrics                 Prometheus text format
//
// Over TCP every request carries "Authorization: Bearer T", a token of
// the server's token file; over its Unix socket the caller is identified
// by the socket's peer credentials and needs none.
//
// # Statuses
//
// Every error answer is an ErrorResponse with a Code. Its status says
// what to do, and SentinelOf maps status and code to the sentinel it
// stands for:
//
//	400  bad input: a malformed digest, namespace, JSON body, digest field or range; a body cut off
//	401  no bearer token, or the wrong one (WWW-Authenticate: Bearer)
//	403  the caller may not do this (code forbidden)                  ErrDenied (fs.ErrPermission)
//	403  a put or delete on a read-only server (code read_only)       blob.ErrReadOnly
//	404  no such blob, namespace or token                             blob.ErrMissing
//	409  a delete refused because the blob is live                    blob.ErrGcRefuse
//	413  a blob over a kv-only store's threshold                      blob.ErrTooLarge
//	416  a range that selects nothing (Content-Range: bytes */SIZE)
//	422  the content does not match a digest claimed for it           blob.ErrVerification
//	429  the caller holds as many live pin tokens as it may           ErrTooMany
//	503  the backend failed: try again (Retry-After)
//	507  the store is full (code no_space)                            blob.ErrNoSpace
//	507  the link would take the namespace over its quota (code quota) blob.ErrQuota
//
// # Compatibility
//
// The server decodes a HaveRequest with unknown fields refused, so a new
// field in a request breaks older servers; golden_test.go holds the bytes
// each type encodes to and fails on any change to them.
package wire
