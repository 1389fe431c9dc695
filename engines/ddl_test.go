package engines

import (
	"slices"
	"testing"
)

func TestDDLRelations(t *testing.T) {
	names, ok := DDLRelations([]string{
		"CREATE TABLE IF NOT EXISTS ns (\n name TEXT PRIMARY KEY)",
		"\n\tcreate unique index if not exists pglo_blobs_oid ON pglo_blobs (oid)",
		"CREATE INDEX IF NOT EXISTS ns_refs_digest ON ns_refs (digest)",
	})
	if want := []string{"ns", "pglo_blobs_oid", "ns_refs_digest"}; !ok || !slices.Equal(names, want) {
		t.Fatalf("DDLRelations = %q, %v; want %q, true", names, ok, want)
	}
	for _, s := range []string{
		"ALTER TABLE ns ADD COLUMN uid BIGINT",
		"CREATE TABLE ns (name TEXT)", // no IF NOT EXISTS: must run
		"CREATE INDEX ON ns (name)",   // unnamed
	} {
		if names, ok := DDLRelations([]string{"CREATE TABLE IF NOT EXISTS a (x INT)", s}); ok {
			t.Errorf("DDLRelations(…, %q) = %q, true; want false", s, names)
		}
	}
}
