package namespaces

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

func TestRebind(t *testing.T) {
	q := `SELECT a FROM t WHERE x = ? AND y > ? LIMIT ?`
	if got := rebind("sqlite", q); got != q {
		t.Fatalf("sqlite rebind changed the query: %s", got)
	}
	if got, want := rebind("postgres", q), `SELECT a FROM t WHERE x = $1 AND y > $2 LIMIT $3`; got != want {
		t.Fatalf("postgres rebind = %s, want %s", got, want)
	}
	pg := newQueries("postgres")
	if strings.Contains(pg.linkRows, "?") || !strings.Contains(pg.linkRows, "$1024") || strings.Contains(pg.linkRows, "$1025") {
		t.Fatalf("postgres batch insert placeholders wrong: ...%s", pg.linkRows[len(pg.linkRows)-60:])
	}
}

// TestSQLiteQueryPlans: the hot queries use the indexes rather than a scan
// and a sort — what keeps IsLive and an arbitration batch (liveAmong)
// probes and Live and Entries streaming at millions of rows, ns_pending
// included: a dead mount's backlog of intents or a big cp -r waiting for
// its RELEASEs makes it large.
func TestSQLiteQueryPlans(t *testing.T) {
	ctx := context.Background()
	e, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r, err := OpenSQL(ctx, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := make([]byte, 32)
	for _, tc := range []struct {
		name, q string
		args    []any
	}{
		{"isLive", r.q.isLive, []any{k, k}},
		{"live", r.q.live, []any{k, k, 10}},
		{"entries", r.q.entries, []any{"a", k, 10}},
		{"names", r.q.names, []any{"a", 10}},
		{"count", r.q.count, []any{"a"}},
		{"liveAmong", liveAmongQuery("sqlite", 2), []any{k, k, k, k}},
		// Every close's: is the digest held, by an intent?
		{"held", r.q.held, []any{"a", k, "a", k}},
		{"pendHeld", r.q.pendHeld, []any{"a", k}},
		{"lockNS", r.q.lockNS, []any{"a"}},
		{"takeRef", r.q.takeRef, []any{"a", k}},
		// FillSizes at every open: the partial index, empty once filled.
		{"unsized", "SELECT digest FROM ns_refs WHERE size IS NULL AND digest > ? ORDER BY digest LIMIT 10", []any{k}},
	} {
		rows, err := e.DB().QueryContext(ctx, "EXPLAIN QUERY PLAN "+tc.q, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan, bad []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
			// A batch's UNION dedups at most a batch of digests.
			union := tc.name == "liveAmong" && detail == "USE TEMP B-TREE FOR UNION"
			if (strings.Contains(detail, "TEMP B-TREE") && !union) || (strings.HasPrefix(detail, "SCAN") && !strings.Contains(detail, "INDEX") && detail != "SCAN CONSTANT ROW") {
				bad = append(bad, detail)
			}
		}
		rows.Close()
		p := strings.Join(plan, "; ")
		t.Logf("%s: %s", tc.name, p)
		if len(bad) > 0 {
			t.Errorf("%s plan sorts or scans without an index (%s): %s", tc.name, strings.Join(bad, ", "), p)
		}
	}
}
