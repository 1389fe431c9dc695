package ops

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/wire"
)

// The wire shapes are package wire's, shared with the wire.
type (
	PutResponse  = wire.PutResponse
	HaveRequest  = wire.HaveRequest
	HaveResponse = wire.HaveResponse
)

// put: POST /v1/blobs?namespace=NS, the body is the blob.
func (s *Server) put(w http.ResponseWriter, r *http.Request) error {
	if s.ro {
		return errReadOnly
	}
	c := caller(r)
	ns := queryValue(r, "namespace")
	if err := s.allow(r.Context(), c, ns, VerbWrite, namespaces.Write|namespaces.Search); err != nil {
		return err
	}
	want, err := claimedDigest(r.Header)
	if err != nil {
		return err
	}
	if !s.tokens.reserve(c.UID) {
		return &httpError{http.StatusTooManyRequests, wire.CodeTooMany, fmt.Sprintf("you hold %d live pin tokens, the most one user may: release some (DELETE /v1/pins/TOKEN) or let them lapse", s.tokens.max)}
	}
	minted := false
	defer func() {
		if !minted {
			s.tokens.unreserve(c.UID)
		}
	}()
	size := r.ContentLength // -1: unknown (chunked)
	// A body up to the kv threshold is held in memory whole: its share of
	// the server's memory first.
	held := s.st.Threshold()
	if size >= 0 {
		held = min(size, held)
	}
	release, err := s.acquire(r.Context(), c.UID, held)
	if err != nil {
		return err
	}
	defer release()
	// The deadline clears at the body's end; a put that returns before it
	// leaves it, so that the server's discarding of the rest is bounded.
	pb := &putBody{dl: deadlineReader{r: r.Body, rc: http.NewResponseController(w), d: s.body}}
	pb.r = &pb.dl
	body := &pb.bodyReader
	part, err := s.ns.LinkRows(ns)
	if err != nil {
		return err
	}
	link := store.WithLink(s.ns, part)
	var d store.Digest
	var pin *store.Pin
	if want != nil {
		d = *want
		pin, err = s.st.PutVerified(r.Context(), d, body, size, link)
	} else {
		d, pin, err = s.st.Put(r.Context(), body, size, link)
	}
	if err != nil && body.err != nil {
		return badRequest("the request body ended early (%v): nothing was stored", body.err)
	}
	if err != nil {
		return s.quotaRefused(r.Context(), ns, err)
	}
	tok := s.tokens.mint(pin, ns, c.UID)
	minted = true
	hex := d.String()
	h := w.Header()
	h.Set("Location", "/v1/blobs/"+hex)
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(appendPutResponse(make([]byte, 0, 128), tok, hex)) // a failed write is the client gone
	return nil
}

// appendPutResponse appends the JSON of PutResponse{tok, hex}, as
// json.Encoder writes it (with its newline): a token is base64url and a
// digest hex, neither of which JSON escapes. TestPutResponseJSON checks
// it against the encoder.
func appendPutResponse(b []byte, tok, hex string) []byte {
	b = append(b, `{"token":"`...)
	b = append(b, tok...)
	b = append(b, `","digest":"`...)
	b = append(b, hex...)
	return append(b, "\"}\n"...)
}

// putBody is a put's body reader and its deadlines, in one allocation.
type putBody struct {
	bodyReader
	dl deadlineReader
}

// queryValue is r.URL.Query().Get(key) without building the map: the
// first value of key in the query. A query with escapes (or a ';', which
// ParseQuery refuses) takes the full parse.
func queryValue(r *http.Request, key string) string {
	q := r.URL.RawQuery
	if strings.ContainsAny(q, "%+;") {
		return r.URL.Query().Get(key)
	}
	for part := range strings.SplitSeq(q, "&") {
		if k, v, _ := strings.Cut(part, "="); k == key {
			return v
		}
	}
	return ""
}

var errReadOnly = &httpError{http.StatusForbidden, "read_only", "this server is read-only (a read-only mount, or a store on read-only media): puts and deletes are refused"}

// bodyReader remembers a failed read of a request body (a client that
// hung up, a body shorter than its Content-Length), so that the put's
// failure is answered as the client's fault.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// checkNamespace checks that ns is a namespace name this server can
// look in; it does not ask whether the namespace exists.
func (s *Server) checkNamespace(ns string) error {
	if s.ns == nil {
		return &httpError{http.StatusServiceUnavailable, "unavailable", "this store keeps no namespaces (its kv engine keeps nothing durable); puts and haves need one"}
	}
	if ns == "" {
		return badRequest("a namespace is required (?namespace=NS for a put, \"namespace\" in a have)")
	}
	if err := namespaces.ValidName(ns); err != nil {
		return badRequest("namespace %q: %v: a name is 1-255 bytes of A-Z a-z 0-9 . _ -, not starting with '.'", clip(ns), err)
	}
	return nil
}

// noNamespace answers an absent namespace (namespaces.ErrNotFound from a
// lookup in it); other errors pass.
func noNamespace(ns string, err error) error {
	if errors.Is(err, namespaces.ErrNotFound) {
		return notFound("namespace %q does not exist", ns)
	}
	return err
}

// claimedDigest reads the digest a putter claims for the body. Every
// claim counts: each sha-256 member of Content-Digest and Repr-Digest (RFC
// 9530: sha-256=:BASE64:) and of the older Digest (RFC 3230:
// SHA-256=BASE64), on one line or several, and each entry of
// X-Alkblobfs-Digest (hex; a comma-separated list, or several lines).
// Other algorithms are ignored, as RFC 9530 lets a recipient do: a field
// without sha-256 claims nothing. A malformed claim is 400. Claims that
// disagree are 422 at once, before the body is read: no content can match
// them all, and checking only one would store content that another claim
// says is not what was sent.
func claimedDigest(h http.Header) (*store.Digest, error) {
	var claim *store.Digest
	var claimedBy string
	add := func(header string, d store.Digest) error {
		if claim != nil && *claim != d {
			return &httpError{http.StatusUnprocessableEntity, "verification",
				fmt.Sprintf("%s claims %s and %s claims %s: no content matches both; nothing was stored", claimedBy, claim, header, d)}
		}
		claim, claimedBy = &d, header
		return nil
	}
	for _, name := range []string{"Content-Digest", "Repr-Digest", "Digest"} {
		ds, err := wire.DigestMembers(strings.Join(h.Values(name), ","))
		if err != nil {
			return nil, badRequest("%s: %v", name, err)
		}
		for _, d := range ds {
			if err := add(name, d); err != nil {
				return nil, err
			}
		}
	}
	for _, v := range h.Values("X-Alkblobfs-Digest") {
		for item := range strings.SplitSeq(v, ",") {
			// Empty list elements are ignored, as RFC 9110 (5.6.1) asks.
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			d, err := store.ParseDigest(item)
			if err != nil {
				return nil, badRequest("X-Alkblobfs-Digest: %v", err)
			}
			if err := add("X-Alkblobfs-Digest", d); err != nil {
				return nil, err
			}
		}
	}
	return claim, nil
}

// have: POST /v1/blobs/have.
func (s *Server) have(w http.ResponseWriter, r *http.Request) error {
	var req HaveRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return badRequest("the request body is over %d bytes; ask about at most %d digests per call", maxJSON, MaxHave)
		}
		return badRequest("the body is not a have request (%v); want {\"namespace\": NS, \"digests\": [hex, …], \"token\"?: T}", err)
	}
	if dec.More() {
		return badRequest("the body holds more than one JSON value")
	}
	if len(req.Digests) > MaxHave {
		return badRequest("%d digests in one have; the most is %d: split the call", len(req.Digests), MaxHave)
	}
	ds := make([]store.Digest, len(req.Digests))
	for i, h := range req.Digests {
		d, err := store.ParseDigest(h)
		if err != nil {
			return badRequest("digests[%d] %q: %v", i, clip(h), err)
		}
		ds[i] = d
	}
	present := make([]bool, len(ds))
	if req.Token != "" {
		// The renewal probe: one token binds one pin, on one digest, put
		// into one namespace. A token that does not match (lapsed, of
		// another server, of another namespace) answers false.
		if len(ds) != 1 {
			return badRequest("a have with a token renews that token's pin: give exactly one digest, not %d", len(ds))
		}
		if err := s.checkNamespace(req.Namespace); err != nil {
			return err
		}
		if err := caller(r).may(VerbWrite); err != nil {
			return err
		}
		present[0] = s.tokens.renew(req.Token, req.Namespace, ds[0], caller(r).UID)
	} else {
		if err := s.allow(r.Context(), caller(r), req.Namespace, VerbRead, namespaces.Search); err != nil {
			return err
		}
		var err error
		if present, _, err = s.ns.Have(r.Context(), req.Namespace, ds); err != nil {
			return noNamespace(req.Namespace, err)
		}
	}
	writeJSON(w, http.StatusOK, HaveResponse{Present: present})
	return nil
}

// delete: DELETE /v1/blobs/{digest}?namespace=NS drops the namespace's
// reference, as rm on the mount does; without a namespace it removes the
// blob from the store now, as alkblobfs rm does, unless something keeps it
// (a namespace links it, a pin holds it): 409.
func (s *Server) delete(w http.ResponseWriter, r *http.Request) error {
	if s.ro {
		return errReadOnly
	}
	d, err := store.ParseDigest(r.PathValue("digest"))
	if err != nil {
		return badRequest("%q is not a digest: %v", clip(r.PathValue("digest")), err)
	}
	c := caller(r)
	if ns := r.URL.Query().Get("namespace"); ns != "" {
		if err := s.allow(r.Context(), c, ns, VerbDelete, namespaces.Remove); err != nil {
			return err
		}
		if err := s.ns.Unlink(r.Context(), ns, d); err != nil {
			if errors.Is(err, blob.ErrMissing) {
				return notFound("namespace %q does not hold %s", ns, d)
			}
			return noNamespace(ns, err)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err := c.may(VerbDelete); err != nil {
		return err
	}
	if c.Namespaces != nil || (c.UID != 0 && c.UID != s.owner.UID) {
		return forbidden("deleting %s from the store needs root or the server's own user, as alkblobfs rm does; to drop a namespace's reference give ?namespace=NS", d)
	}
	if err := s.st.Delete(r.Context(), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// release: DELETE /v1/pins/{token}.
func (s *Server) release(w http.ResponseWriter, r *http.Request) error {
	if err := caller(r).may(VerbWrite); err != nil {
		return err
	}
	if !s.tokens.release(r.PathValue("token"), caller(r).UID) {
		return notFound("no such pin token of yours (it may have expired)")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// get: GET or HEAD /v1/blobs/{digest}[?namespace=NS], with Range.
func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	d, err := store.ParseDigest(r.PathValue("digest"))
	if err != nil {
		return badRequest("%q is not a digest: %v", clip(r.PathValue("digest")), err)
	}
	c := caller(r)
	if ns := r.URL.Query().Get("namespace"); ns != "" {
		if err := s.allow(r.Context(), c, ns, VerbRead, namespaces.Search); err != nil {
			return err
		}
		if _, ok, err := s.ns.Has(r.Context(), ns, d); err != nil {
			return noNamespace(ns, err)
		} else if !ok {
			return notFound("namespace %q does not hold %s", ns, d)
		}
	} else if err := c.may(VerbRead); err != nil {
		return err
	} else if c.UID != 0 || c.Namespaces != nil {
		if s.ns == nil {
			return forbidden("this store keeps no namespaces: only root reads a blob here")
		}
		ok, err := s.readableLink(r.Context(), c, d)
		if err != nil {
			return err
		}
		if !ok {
			// The same answer whether the blob exists or not.
			return notFound("no namespace you may read links %s (name one: ?namespace=NS)", d)
		}
	}
	rd, ok, err := s.st.Get(r.Context(), d)
	if err != nil {
		return err
	}
	if !ok {
		return notFound("no blob %s", d)
	}
	defer rd.Close()
	size := rd.Len()
	etag := `"` + d.String() + `"`
	h := w.Header()
	// Set on the answers that carry the blob (or say it is unchanged), never
	// on errors: a cache keeps these for a year. Not "public" behind a
	// token: a shared cache must not serve the blob to clients without it.
	cacheable := func() {
		h.Set("ETag", etag)
		// Never "public": who may read a blob depends on the caller, and a
		// shared cache must not serve it to others.
		h.Set("Cache-Control", "private, max-age=31536000, immutable")
	}
	h.Set("Accept-Ranges", "bytes")
	if inm := r.Header.Get("If-None-Match"); inm != "" && etagMatch(inm, etag) {
		cacheable()
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	off, n, ranged, err := parseRange(r.Header.Get("Range"), size)
	if ir := r.Header.Get("If-Range"); ir != "" && ir != etag {
		ranged, err = false, nil // a changed representation: the whole of it
	}
	if err != nil {
		h.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
		return &httpError{http.StatusRequestedRangeNotSatisfiable, "bad_range", err.Error()}
	}
	if !ranged {
		cacheable()
		setDigest(h, d)
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			dw := &deadlineWriter{w: w, rc: http.NewResponseController(w), d: s.body}
			s.send(dw, r, rd, 0, size)
		}
		return nil
	}
	// A slice: its digest goes in the headers, so it is read (and its
	// chunks checked) first. A longer range than store.MaxReadRange gets
	// its first MaxReadRange bytes, and Content-Range says so: the client
	// asks again for the rest (RFC 9110 §15.3.7).
	n = min(n, store.MaxReadRange, s.share)
	release, err := s.acquire(r.Context(), c.UID, n)
	if err != nil {
		return err
	}
	defer release()
	body := make([]byte, n)
	if k, err := rd.ReadAt(body, off); k < len(body) {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("read %s: %d bytes at %d, want %d: %w", d, k, off, n, io.ErrUnexpectedEOF)
		}
		return err
	}
	cacheable()
	setDigest(h, sha256.Sum256(body))
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, off+n-1, size))
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusPartialContent)
	if r.Method != http.MethodHead {
		dw := &deadlineWriter{w: w, rc: http.NewResponseController(w), d: s.body}
		for len(body) > 0 { // a deadline per MiB, not for the whole range
			k := min(len(body), 1<<20)
			if _, err := dw.Write(body[:k]); err != nil {
				panic(http.ErrAbortHandler) // the client is gone, or too slow
			}
			body = body[k:]
		}
	}
	return nil
}

// send streams n bytes of rd from off through ReadAt, which checks every
// chunk before it returns it: a byte is written only once it has passed.
// A failure cuts the connection (abort).
func (s *Server) send(w io.Writer, r *http.Request, rd *store.Reader, off, n int64) {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		k, err := rd.ReadAt(buf[:min(int64(len(buf)), n)], off)
		if err != nil && !(err == io.EOF && int64(k) == n) {
			if err == io.EOF {
				err = fmt.Errorf("read %s: ended %d bytes early: %w", rd.Digest(), n-int64(k), io.ErrUnexpectedEOF)
			}
			s.abort(r, rd.Digest(), err)
		}
		if _, werr := w.Write(buf[:k]); werr != nil {
			panic(http.ErrAbortHandler) // the client is gone
		}
		off += int64(k)
		n -= int64(k)
	}
}

// abort ends a response whose headers are out: the connection is cut, so
// that the client sees a broken transfer, never a short or wrong body that
// looks complete.
func (s *Server) abort(r *http.Request, d store.Digest, err error) {
	if r.Context().Err() == nil {
		s.log.Error("http read failed mid-response", "digest", d, "err", err)
		s.metrics.countError(kindOf(err))
	}
	panic(http.ErrAbortHandler)
}

func kindOf(err error) string { _, k := classify(err); return k }

// setDigest sets the digest of the bytes the response carries. Both
// headers hold the same value: Content-Digest is the RFC 9530 name for the
// digest of the message's content; Repr-Digest is what this API promises
// on every response, ranged ones included (where RFC 9530 would give the
// whole representation's digest; ETag carries that one).
func setDigest(h http.Header, d store.Digest) {
	v := wire.DigestField(d)
	h.Set("Repr-Digest", v)
	h.Set("Content-Digest", v)
}

// etagMatch reports whether an If-None-Match list names etag (weak
// comparison, as RFC 9110 asks for If-None-Match).
func etagMatch(list, etag string) bool {
	for item := range strings.SplitSeq(list, ",") {
		item = strings.TrimPrefix(strings.TrimSpace(item), "W/")
		if item == "*" || item == etag {
			return true
		}
	}
	return false
}

// parseRange reads a Range header against a blob of size bytes. It serves
// one range: a header it does not understand, or one asking for several
// ranges, is ignored (the whole blob is sent, as RFC 9110 allows). A
// single range that selects nothing is an error (416).
func parseRange(h string, size int64) (off, n int64, ranged bool, err error) {
	spec, ok := strings.CutPrefix(h, "bytes=")
	if h == "" || !ok || strings.Contains(spec, ",") || size == 0 {
		// An empty blob has no range to give: the whole of it (200).
		return 0, size, false, nil
	}
	first, last, ok := strings.Cut(strings.TrimSpace(spec), "-")
	if !ok {
		return 0, 0, false, fmt.Errorf("range %q: want bytes=FIRST-[LAST] or bytes=-SUFFIX", clip(h))
	}
	bad := fmt.Errorf("range %q does not fit a blob of %d bytes", clip(h), size)
	if first == "" { // the last N bytes
		k, err := strconv.ParseInt(last, 10, 64)
		if err != nil || k <= 0 || size == 0 {
			return 0, 0, false, bad
		}
		k = min(k, size)
		return size - k, k, true, nil
	}
	a, err := strconv.ParseInt(first, 10, 64)
	if err != nil || a < 0 || a >= size {
		return 0, 0, false, bad
	}
	b := size - 1
	if last != "" {
		b, err = strconv.ParseInt(last, 10, 64)
		if err != nil || b < a {
			return 0, 0, false, bad
		}
		b = min(b, size-1)
	}
	return a, b - a + 1, true, nil
}

// clip shortens user input quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
