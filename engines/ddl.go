package engines

import "regexp"

// ddlName matches the statements a schema is made of: CREATE TABLE or
// CREATE [UNIQUE] INDEX, IF NOT EXISTS, and the relation's name.
var ddlName = regexp.MustCompile(`(?is)^\s*CREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX)\s+IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)\b`)

// DDLRelations returns the names of the tables and indexes that ddl
// creates, in order, and ok false if any statement is not a CREATE TABLE
// or CREATE INDEX … IF NOT EXISTS (its effect then cannot be checked by
// name, and it must run).
//
// A schema whose relations all exist is left alone without running its
// DDL: on PostgreSQL, CREATE INDEX IF NOT EXISTS takes a SHARE lock on its
// table even when the index exists, so a transaction of such statements
// waits for every writer of those tables, and deadlocks with a writer
// that holds one and waits for another (a CLI opening the store beside a
// busy mount: SQLSTATE 40P01).
func DDLRelations(ddl []string) (names []string, ok bool) {
	for _, s := range ddl {
		m := ddlName.FindStringSubmatch(s)
		if m == nil {
			return nil, false
		}
		names = append(names, m[1])
	}
	return names, true
}

// PGMissingRelations is the PostgreSQL query that counts which of $1
// (text[]) do not exist in the current search path.
const PGMissingRelations = `SELECT count(*) FROM unnest($1::text[]) AS r(name) WHERE to_regclass(r.name) IS NULL`
