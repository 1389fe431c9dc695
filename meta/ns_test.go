package meta_test

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/meta"
)

func TestNSRebind(t *testing.T) {
	q := `SELECT a FROM t WHERE x = ? AND y > ? LIMIT ?`
	if got := engines.Rebind("sqlite", q); got != q {
		t.Fatalf("sqlite rebind changed the query: %s", got)
	}
	if got, want := engines.Rebind("postgres", q), `SELECT a FROM t WHERE x = $1 AND y > $2 LIMIT $3`; got != want {
		t.Fatalf("postgres rebind = %s, want %s", got, want)
	}
	pg := meta.NSQueries("postgres")["linkRows"]
	if strings.Contains(pg, "?") || !strings.Contains(pg, "$1024") || strings.Contains(pg, "$1025") {
		t.Fatalf("postgres batch insert placeholders wrong: ...%s", pg[len(pg)-60:])
	}
	if len(meta.NSDDL("postgres")) == 0 {
		t.Fatal("no postgres DDL")
	}
}

// openNSTables opens a SQLite engine with the namespaces' tables, closed
// when t ends.
func openNSTables(t *testing.T) *sqlite.Engine {
	t.Helper()
	e, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := meta.OpenLinks(t.Context(), meta.LinksConfig{Engine: e}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestNSSQLiteQueryPlans: the hot queries use the indexes rather than a scan
// and a sort — what keeps IsLive and an arbitration batch (liveAmong)
// probes and Live and Entries streaming at millions of rows, ns_pending
// included: a dead mount's backlog of intents or a big cp -r waiting for
// its RELEASEs makes it large.
func TestNSSQLiteQueryPlans(t *testing.T) {
	ctx := context.Background()
	e := openNSTables(t)
	q := meta.NSQueries("sqlite")
	k := make([]byte, 32)
	for _, tc := range []struct {
		name, q string
		args    []any
	}{
		{"isLive", q["isLive"], []any{k, k}},
		{"live", q["live"], []any{k, k, 10}},
		{"entries", q["entries"], []any{"a", k, 10}},
		{"names", q["names"], []any{"a", 10}},
		{"count", q["count"], []any{"a"}},
		{"liveAmong", q["liveAmong2"], []any{k, k, k, k}},
		// Every close's: is the digest held, by an intent?
		{"held", q["held"], []any{"a", k, "a", k}},
		{"pendHeld", q["pendHeld"], []any{"a", k}},
		{"lockNS", q["lockNS"], []any{"a"}},
		{"takeRef", q["takeRef"], []any{"a", k}},
		// FillSizes at every open: the partial index, empty once filled.
		{"unsized", q["unsized"], []any{k, k, 10}},
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

// TestNSSQLiteIndexesRead: every index of the tables a small close
// writes (ns_refs, ns_pending) is read by one of the namespaces'
// statements. Each index costs every close a b-tree page in the WAL and
// again at the checkpoint, so one that no statement reads is a cost with
// no use: drop it (docs/gc.md, "What a small close writes"). The log says
// which statements read each index.
func TestNSSQLiteIndexesRead(t *testing.T) {
	ctx := context.Background()
	e := openNSTables(t)
	k := make([]byte, 32)
	readers := map[string][]string{}
	for name, q := range meta.NSQueries("sqlite") {
		args := make([]any, strings.Count(q, "?"))
		for i := range args {
			args[i] = k
		}
		rows, err := e.DB().QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			if m := planIndex.FindStringSubmatch(detail); m != nil && !slices.Contains(readers[m[1]], name) {
				readers[m[1]] = append(readers[m[1]], name)
			}
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			t.Fatal(err)
		}
	}
	// sql IS NULL: the automatic index of a UNIQUE or PRIMARY KEY
	// constraint, which enforces the constraint.
	rows, err := e.DB().QueryContext(ctx, `SELECT name FROM sqlite_master
		WHERE type = 'index' AND tbl_name IN ('ns_refs', 'ns_pending') AND sql IS NOT NULL ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n int
	for rows.Next() {
		var idx string
		if err := rows.Scan(&idx); err != nil {
			t.Fatal(err)
		}
		n++
		slices.Sort(readers[idx])
		t.Logf("%s: %s", idx, strings.Join(readers[idx], ", "))
		if len(readers[idx]) == 0 {
			t.Errorf("no statement reads the index %s, which every write of its table updates", idx)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("found no index on ns_refs or ns_pending: the check checks nothing")
	}
}

// planIndex finds the index a step of EXPLAIN QUERY PLAN reads.
var planIndex = regexp.MustCompile(`USING (?:COVERING )?INDEX (\w+)`)

// TestNSSettleGroup: settles that go in one statement (PostgreSQL) link
// each (namespace, digest) once, and each caller learns whether its own
// settle linked: of two intents for one digest, exactly one did.
func TestNSSettleGroup(t *testing.T) {
	ctx := t.Context()
	e, err := postgres.Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	l, err := meta.OpenLinks(ctx, meta.LinksConfig{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Create(ctx, "grp", nil); err != nil {
		t.Fatal(err)
	}
	d1, d2 := blob.Sum([]byte("settle group 1")), blob.Sum([]byte("settle group 2"))
	p := meta.NSIntent{Holder: "test:host:1:x", TTL: time.Minute}
	var ids []int64
	for _, d := range []blob.Digest{d1, d1, d2} {
		id, err := l.Pend(ctx, "grp", d, p)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	linked, errs := meta.SettleGroup(l, ids, 1)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if linked[0] == linked[1] || !linked[2] {
		t.Fatalf("linked: d1 %v and %v, d2 %v; want one of d1's and d2's", linked[0], linked[1], linked[2])
	}
	for _, d := range []blob.Digest{d1, d2} {
		if _, ok, err := l.Has(ctx, "grp", d); !ok || err != nil {
			t.Fatalf("Has(%s) after the group = %v, %v", d, ok, err)
		}
	}
	if ok, err := l.AnyPending(ctx, "grp"); ok || err != nil {
		t.Fatalf("intents left after the group: %v, %v", ok, err)
	}
	// Settled again (a retry): nothing to take, nothing linked.
	if linked, err := l.Settle(ctx, ids[2]); linked || err != nil {
		t.Fatalf("a second settle = %v, %v; want false, nil", linked, err)
	}
}
