package namespaces_test

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// *store.Store is the Pool a Service checks and pins through.
var _ namespaces.Pool = (*store.Store)(nil)

// TestStorePublishAndLink wires a registry to a real store the way the
// mount does: Open on the kv engine, the registry as a liveness source, and
// puts that link through linkTo: store.WithLink with svc.LinkRows(ns) — inside the put's
// transaction on SQLite, right after publish on mem.
func TestStorePublishAndLink(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   func(t *testing.T) engines.KV
		reg  string
	}{
		{"sqlite", func(t *testing.T) engines.KV {
			e, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "kv.db"))
			if err != nil {
				t.Fatal(err)
			}
			return e
		}, "*namespaces.SQL"},
		{"mem", func(t *testing.T) engines.KV { return mem.New() }, "*namespaces.Mem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			kv := tc.kv(t)
			st, err := store.Open(ctx, store.Config{KV: kv, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			r, err := namespaces.Open(ctx, kv, nil)
			if err != nil {
				t.Fatal(err)
			}
			st.Register(r)
			svc := namespaces.NewService(r, st)
			mustDo(t, svc.Create(ctx, "builds"))

			d, pin, err := st.PutBytes(ctx, []byte("app.tar"), linkTo(t, svc, "builds"))
			if err != nil {
				t.Fatal(err)
			}
			pin.Release()
			if _, ok, err := svc.Has(ctx, "builds", d); err != nil || !ok {
				t.Fatalf("put did not link: %v, %v", ok, err)
			}
			// A put whose link fails publishes nothing (SQLite) or fails
			// (mem); either way no reference appears.
			_, _, err = st.PutBytes(ctx, []byte("orphan"), linkTo(t, svc, "nope"))
			if err == nil {
				t.Fatal("put linking into an absent namespace succeeded")
			}
			for range 2 {
				if _, err := st.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if ok, err := st.Has(ctx, d); err != nil || !ok {
				t.Fatalf("linked blob swept: %v, %v", ok, err)
			}
			mustDo(t, svc.Unlink(ctx, "builds", d))
			for range 2 {
				if _, err := st.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if ok, _ := st.Has(ctx, d); ok {
				t.Fatal("unlinked blob survived two sweeps")
			}
		})
	}
}

// linkTo is the put option that links the put's digest into ns
// (Service.LinkRows).
func linkTo(t *testing.T, svc *namespaces.Service, ns string) store.PutOption {
	t.Helper()
	part, err := svc.LinkRows(ns)
	if err != nil {
		t.Fatal(err)
	}
	return store.WithLink(svc, part)
}
