package namespaces

import (
	"context"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// TestSettleGroup: settles that go in one statement (PostgreSQL) link each
// (namespace, digest) once, and each caller learns whether its own settle
// linked: of two intents for one digest, exactly one did.
func TestSettleGroup(t *testing.T) {
	ctx := t.Context()
	e, err := postgres.Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r, err := OpenSQL(ctx, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Create(ctx, "grp"); err != nil {
		t.Fatal(err)
	}
	d1, d2 := blob.Sum([]byte("settle group 1")), blob.Sum([]byte("settle group 2"))
	p := Pending{Holder: "test:host:1:x", TTL: time.Minute}
	var jobs []*settleJob
	for _, d := range []blob.Digest{d1, d1, d2} {
		i, err := r.Pend(ctx, "grp", d, p)
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, &settleJob{i: i, now: 1, ctx: context.Background(), done: make(chan struct{})})
	}
	r.settles.settle(jobs)
	for _, j := range jobs {
		if j.err != nil {
			t.Fatal(j.err)
		}
	}
	if jobs[0].linked == jobs[1].linked || !jobs[2].linked {
		t.Fatalf("linked: d1 %v and %v, d2 %v; want one of d1's and d2's", jobs[0].linked, jobs[1].linked, jobs[2].linked)
	}
	for _, d := range []blob.Digest{d1, d2} {
		if _, ok, err := r.Has(ctx, "grp", d); !ok || err != nil {
			t.Fatalf("Has(%s) after the group = %v, %v", d, ok, err)
		}
	}
	if ok, err := r.anyPending(ctx, "grp"); ok || err != nil {
		t.Fatalf("intents left after the group: %v, %v", ok, err)
	}
	// Settled again (a retry): nothing to take, nothing linked.
	if linked, err := r.Settle(ctx, jobs[2].i); linked || err != nil {
		t.Fatalf("a second settle = %v, %v; want false, nil", linked, err)
	}
}
