package nstest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// model is the registry's specification: namespace → digest → linked_at.
type model map[string]map[blob.Digest]int64

// errKind classifies an error for comparison with the model's answer.
func errKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{namespaces.ErrExists, "exists"}, {namespaces.ErrNotEmpty, "notempty"},
		{namespaces.ErrNotFound, "notfound"}, {namespaces.ErrBadName, "badname"},
		{blob.ErrMissing, "missing"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return "ok"
}

const walkSteps = 2000

// testWalk drives the registry and the model with the same seeded random
// operations and compares every answer, and the whole state every 50 steps.
func testWalk(t *testing.T, open Opener) {
	ctx := context.Background()
	r, c := fresh(t, open)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)
	m := model{}
	nss := []string{"a", "b", "c", ".bad"}
	digest := func() blob.Digest { return D(rng.IntN(16)) }

	check := func(step int, op string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("seed %d step %d %s: got %v, model says %v", seed, step, op, got, want)
		}
	}
	for step := range walkSteps {
		c.Advance(time.Duration(rng.IntN(3)) * time.Second)
		now := c.Now().UnixNano()
		ns := nss[rng.IntN(len(nss))]
		refs, exists := m[ns]
		bad := ns == ".bad"
		switch op := rng.IntN(7); op {
		case 0:
			err := r.Create(ctx, ns)
			want := "ok"
			switch {
			case bad:
				want = "badname"
			case exists:
				want = "exists"
			default:
				m[ns] = map[blob.Digest]int64{}
			}
			check(step, "Create "+ns, errKind(err), want)
		case 1:
			err := r.Remove(ctx, ns)
			want := "ok"
			switch {
			case bad:
				want = "badname"
			case !exists:
				want = "notfound"
			case len(refs) > 0:
				want = "notempty"
			default:
				delete(m, ns)
			}
			check(step, "Remove "+ns, errKind(err), want)
		case 2, 3:
			d := digest()
			linked, err := r.Link(ctx, ns, d)
			want, wantLinked := "ok", false
			switch {
			case bad:
				want = "badname"
			case !exists:
				want = "notfound"
			default:
				if _, ok := refs[d]; !ok {
					refs[d], wantLinked = now, true
				}
			}
			check(step, "Link "+ns, fmt.Sprint(errKind(err), linked), fmt.Sprint(want, wantLinked))
		case 4:
			batch := make([]blob.Digest, rng.IntN(5))
			for i := range batch {
				batch[i] = digest()
			}
			n, err := r.LinkMany(ctx, ns, batch)
			want, wantN := "ok", 0
			switch {
			case bad:
				want = "badname"
			case !exists:
				want = "notfound"
			default:
				for _, d := range batch {
					if _, ok := refs[d]; !ok {
						refs[d] = now
						wantN++
					}
				}
			}
			check(step, "LinkMany "+ns, fmt.Sprint(errKind(err), n), fmt.Sprint(want, wantN))
		case 5:
			d := digest()
			err := r.Unlink(ctx, ns, d)
			want := "ok"
			switch _, linked := refs[d]; {
			case bad:
				want = "badname"
			case !exists:
				want = "notfound"
			case !linked:
				want = "missing"
			default:
				delete(refs, d)
			}
			check(step, "Unlink "+ns, errKind(err), want)
		case 6:
			d := digest()
			ref, ok, err := r.Has(ctx, ns, d)
			at, linked := refs[d]
			want := "ok"
			switch {
			case bad:
				want, linked = "badname", false
			case !exists:
				want = "notfound"
			}
			got := fmt.Sprint(errKind(err), ok)
			if ok {
				got += fmt.Sprint(" ", ref.LinkedAt.UnixNano())
			}
			wantS := fmt.Sprint(want, linked)
			if linked {
				wantS += fmt.Sprint(" ", at)
			}
			check(step, "Has "+ns, got, wantS)
		}
		if step%50 == 49 {
			check(step, "state", state(t, r, ds(0, 16)...), m.state(ds(0, 16)))
		}
	}
	check(walkSteps, "state", state(t, r, ds(0, 16)...), m.state(ds(0, 16)))
}

// state renders the model as state renders a registry.
func (m model) state(probes []blob.Digest) string {
	var out []byte
	liveSet := map[blob.Digest]bool{}
	for _, ns := range slices.Sorted(maps.Keys(m)) {
		refs := m[ns]
		out = fmt.Appendf(out, "ns %s count=%d\n", ns, len(refs))
		for _, d := range slices.SortedFunc(maps.Keys(refs), blob.Digest.Compare) {
			out = fmt.Appendf(out, "  %s %d\n", d, refs[d])
			liveSet[d] = true
		}
	}
	for _, d := range slices.SortedFunc(maps.Keys(liveSet), blob.Digest.Compare) {
		out = fmt.Appendf(out, "live %s\n", d)
	}
	for _, d := range probes {
		out = fmt.Appendf(out, "islive %s %v\n", d.Short(), liveSet[d])
	}
	return string(out)
}
