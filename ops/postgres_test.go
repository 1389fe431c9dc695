package ops_test

import (
	"bytes"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/client"
	"github.com/alkblobfs/alkblobfs/engines/pglo"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/store"
)

// fleetHost opens one fleet host's store on dsn (kv postgres, large pglo)
// with the namespaces registered as its liveness source.
func fleetHost(t *testing.T, dsn string) (*store.Store, *namespaces.Service) {
	t.Helper()
	kv, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	large, err := pglo.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return openStore(t, store.Config{KV: kv, Large: large, Fleet: true, PinTTL: 3 * time.Second})
}

// Two servers on one PostgreSQL pool in fleet mode: a token minted on A
// keeps its blob alive across sweeps started on B, until A releases it.
func TestFleetTokens(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, nsA := fleetHost(t, dsn)
	b, nsB := fleetHost(t, dsn)
	if err := nsA.Create(t.Context(), "builds"); err != nil {
		t.Fatal(err)
	}
	var clients []*client.Client
	for _, h := range []struct {
		st *store.Store
		ns *namespaces.Service
	}{{a, nsA}, {b, nsB}} {
		srv := ops.New(ops.Config{Store: h.st, Namespaces: h.ns, InsecureLoopback: true})
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(func() { hs.Close(); srv.Close() })
		c, err := client.New(hs.URL, "")
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	ca, cb := clients[0], clients[1]
	for _, size := range []int{3000, 300 << 10} { // both tiers
		content := randBytes(size, uint64(size))
		d, tok, err := ca.Put(t.Context(), "builds", bytes.NewReader(content), int64(size), nil)
		if err != nil {
			t.Fatal(err)
		}
		// B sees the entry, then drops it; only A's token holds the blob.
		if got, err := cb.Have(t.Context(), "builds", []blob.Digest{d}); err != nil || !got[0] {
			t.Fatalf("have on B = %v, %v", got, err)
		}
		if err := nsB.Unlink(t.Context(), "builds", d); err != nil {
			t.Fatal(err)
		}
		sweep := func() {
			t.Helper()
			for range 2 {
				if r, err := b.Sweep(t.Context()); err != nil || r.Aborted != "" {
					t.Fatalf("sweep on B: %+v, %v", r, err)
				}
			}
		}
		sweep()
		if ok, _ := b.Has(t.Context(), d); !ok {
			t.Fatal("a sweep on B collected a blob A's token pins")
		}
		// Tokens are the minting server's: B does not know A's.
		if ok, err := cb.Renew(t.Context(), "builds", tok, d); ok || err != nil {
			t.Fatalf("renewal on B = %v, %v; want false", ok, err)
		}
		if ok, err := ca.Renew(t.Context(), "builds", tok, d); !ok || err != nil {
			t.Fatalf("renewal on A = %v, %v", ok, err)
		}
		if err := ca.Release(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
		// A drops a released pin's row at its next renewal (every PinTTL/3).
		deadline := time.Now().Add(10 * time.Second)
		for {
			sweep()
			if ok, _ := b.Has(t.Context(), d); !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the blob outlived its released token")
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}
