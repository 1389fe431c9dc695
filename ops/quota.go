package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/wire"
)

// The namespace routes give HTTP what alkblobfs ns usage and ns quota
// give, with the rule of package namespaces:
//
//	GET    /v1/namespaces/{ns}/usage   search (x) on NS, verb read, as have
//	PUT    /v1/namespaces/{ns}/quota   wire.Quota; root or the server's own user, verb sweep
//	DELETE /v1/namespaces/{ns}/quota   clears both limits; as PUT
//
// Each answers the namespace's wire.Usage. Setting a quota is an admin
// act, as a sweep is: a token bound to namespaces may not, whoever it acts
// as, and namespaces.AllowedQuota decides for the rest.

// maxQuotaBody bounds a quota request: two numbers and their names.
const maxQuotaBody = 256

func (s *Server) namespaceRoutes() {
	s.route("GET /v1/namespaces/{ns}/usage", "usage", s.usage)
	s.route("PUT /v1/namespaces/{ns}/quota", "quota", s.setQuota)
	s.route("DELETE /v1/namespaces/{ns}/quota", "quota", s.setQuota)
}

// usage: GET /v1/namespaces/{ns}/usage.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) error {
	ns := r.PathValue("ns")
	if err := s.allow(r.Context(), caller(r), ns, VerbRead, namespaces.Search); err != nil {
		return err
	}
	u, err := s.ns.Usage(r.Context(), ns)
	if err != nil {
		return noNamespace(ns, err)
	}
	// The unique figures cost a query over the namespace's references:
	// this route, which a person or a script asks for by name, pays it;
	// /metrics, the 507 and the quota reply do not.
	uq, err := s.ns.Unique(r.Context(), ns)
	if err != nil {
		return noNamespace(ns, err)
	}
	out := wireUsage(ns, u)
	out.Unique = &wire.Unique{Blobs: uq.Blobs, Bytes: uq.Bytes}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// setQuota: PUT /v1/namespaces/{ns}/quota with a wire.Quota, or DELETE to
// clear it.
func (s *Server) setQuota(w http.ResponseWriter, r *http.Request) error {
	ns := r.PathValue("ns")
	c := caller(r)
	if err := c.may(VerbSweep); err != nil {
		return err
	}
	if err := s.checkNamespace(ns); err != nil {
		return err
	}
	if c.Namespaces != nil {
		return forbidden("namespace %q: a token bound to namespaces does not set quotas: only root and the server's own user set quotas, with a token not bound to namespaces", ns)
	}
	if err := namespaces.AllowedQuota(c.Principal, s.owner.UID); err != nil {
		return forbidden("namespace %q: only root and the server's own user set quotas", ns)
	}
	if s.ro {
		return errReadOnly
	}
	var q wire.Quota
	if r.Method == http.MethodPut {
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxQuotaBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&q); err != nil {
			return badRequest("the body is not a quota (%v); want {\"bytes\": N, \"blobs\": N}, 0 for no limit", err)
		}
		if dec.More() {
			return badRequest("the body holds more than one JSON value")
		}
		if q.Bytes < 0 || q.Blobs < 0 {
			return badRequest("a quota is 0 (no limit) or more, not bytes=%d blobs=%d", q.Bytes, q.Blobs)
		}
	}
	ctx := r.Context()
	if err := s.ns.SetQuota(ctx, ns, namespaces.Quota{Bytes: q.Bytes, Blobs: q.Blobs}); err != nil {
		return noNamespace(ns, err)
	}
	u, err := s.ns.Usage(ctx, ns)
	if err != nil {
		return noNamespace(ns, err)
	}
	writeJSON(w, http.StatusOK, wireUsage(ns, u))
	return nil
}

// wireUsage is u's counters and quota, without the unique figures.
func wireUsage(ns string, u namespaces.Usage) wire.Usage {
	return wire.Usage{
		Namespace: ns,
		Blobs:     u.Blobs,
		Bytes:     u.Bytes,
		Quota:     wire.Quota{Bytes: u.Quota.Bytes, Blobs: u.Quota.Blobs},
	}
}

// quotaRefused is the answer to a put whose link the namespace's quota
// refused: 507 with code quota, naming the namespace, its limit and what
// it holds, which are the caller's to know (it may write there).
func (s *Server) quotaRefused(ctx context.Context, ns string, err error) error {
	if !errors.Is(err, blob.ErrQuota) {
		return err
	}
	msg := fmt.Sprintf("namespace %q is at its quota: nothing was linked", ns)
	if u, uerr := s.ns.Usage(ctx, ns); uerr == nil {
		msg = fmt.Sprintf("namespace %q is at its quota (it %s): nothing was linked; unlink blobs from it, or ask root or the server's own user for more", ns, QuotaState(u))
	}
	return &httpError{http.StatusInsufficientStorage, wire.CodeQuota, msg}
}

// QuotaState says what a namespace holds against its limits, for
// messages: "holds 90 of 100 bytes and 1 blob". The CLI says it the same
// way.
func QuotaState(u namespaces.Usage) string {
	part := func(n, limit int64, unit string) string {
		if limit <= 0 {
			return namespaces.Count(n, unit)
		}
		return fmt.Sprintf("%d of %s", n, namespaces.Count(limit, unit))
	}
	return "holds " + part(u.Bytes, u.Quota.Bytes, "byte") + " and " + part(u.Blobs, u.Quota.Blobs, "blob")
}
