package namespaces_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/gc/gctest"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestIntentsSkew: two registries on one database — two mounts on hosts
// whose clocks are 5 minutes fast and 5 minutes slow — agree on when an
// intent lapses. The fast one never settles the slow one's intents while
// their writer renews them; the slow one settles a dead fast writer's
// within their TTL.
func TestIntentsSkew(t *testing.T) {
	for _, tc := range []struct {
		name string
		pair func(t *testing.T, fast, slow namespaces.Clock) (f, s *namespaces.SQL)
	}{
		{"sqlite", func(t *testing.T, fast, slow namespaces.Clock) (*namespaces.SQL, *namespaces.SQL) {
			path := filepath.Join(t.TempDir(), "kv.db")
			f, _ := openSQLiteEngine(t, path, fast)
			s, _ := openSQLiteEngine(t, path, slow)
			return f, s
		}},
		{"postgres", func(t *testing.T, fast, slow namespaces.Clock) (*namespaces.SQL, *namespaces.SQL) {
			dsn := pgtest.DSN(t)
			f, _ := openPostgres(t, dsn, fast)
			s, _ := openPostgres(t, dsn, slow)
			return f, s
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, slow := tc.pair(t, gctest.Skewed(5*time.Minute), gctest.Skewed(-5*time.Minute))
			testIntentsSkew(t, fast, slow)
		})
	}
}

func testIntentsSkew(t *testing.T, fast, slow *namespaces.SQL) {
	ctx := t.Context()
	const ttl = time.Second
	mustDo(t, slow.Create(ctx, "ns"))
	// The slow host's writer renews every TTL/3, as a mount does, for two
	// TTLs; the fast host's recoveries settle nothing of it.
	live := blob.Sum([]byte("being written"))
	_, err := slow.Pend(ctx, "ns", live, namespaces.Pending{Holder: "slow", TTL: ttl})
	mustDo(t, err)
	for start := time.Now(); time.Since(start) < 2*ttl; time.Sleep(ttl / 3) {
		mustDo(t, slow.Renew(ctx, "slow", ttl))
		if n, err := fast.Recover(ctx, ""); n != 0 || err != nil {
			t.Fatalf("the fast host's Recover settled %d intents (%v) of a writer that renews them: its clock, 10 min ahead, decided they had lapsed", n, err)
		}
	}
	// The fast host's writer dies at once; its intent lapses a TTL later
	// for the slow host too, not 10 minutes later.
	dead := blob.Sum([]byte("writer died"))
	start := time.Now()
	_, err = fast.Pend(ctx, "ns", dead, namespaces.Pending{Holder: "fast", TTL: ttl})
	mustDo(t, err)
	for {
		mustDo(t, slow.Renew(ctx, "slow", ttl)) // still writing
		n, err := slow.Recover(ctx, "")
		mustDo(t, err)
		if n > 0 {
			break
		}
		if time.Since(start) > ttl+5*time.Second {
			t.Fatalf("a dead writer's intent (TTL %s) is not settled after %s", ttl, time.Since(start))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, ok, err := slow.Has(ctx, "ns", dead); !ok || err != nil {
		t.Fatalf("the dead writer's intent was not linked: %v, %v", ok, err)
	}
	if _, ok, _ := slow.Has(ctx, "ns", live); ok {
		t.Fatal("the live writer's intent was settled")
	}
}
