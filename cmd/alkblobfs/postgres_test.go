package main

import (
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// The PostgreSQL engine URLs, end to end through the binary.

func TestRoundTripPostgresSameDatabase(t *testing.T) {
	dsn := pgtest.DSN(t)
	roundTrip(t, newCLI(t, "--kv", dsn, "--large", "pglo"), true)
}

func TestRoundTripPglo(t *testing.T) {
	// The default SQLite kv tier with large objects in PostgreSQL.
	roundTrip(t, newCLI(t, "--large", "pglo:"+pgtest.DSN(t)), true)
}

// TestPostgresUnreachable: a server that is not there is exit 1 with one
// line naming host:port, never the password.
func TestPostgresUnreachable(t *testing.T) {
	const secret = "hunter2-s3cret"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // now closed: connections are refused
	dsn := "postgres://alice:" + secret + "@" + addr + "/blobs?sslmode=disable"
	for _, flags := range [][]string{
		{"--kv", dsn, "--large", "pglo"},
		{"--kv", dsn},
		{"--large", "pglo:" + dsn},
	} {
		r := newCLI(t, flags...).fail(1, addr, "ls")
		if strings.Contains(r.stderr, secret) {
			t.Errorf("%v: stderr shows the password: %q", flags, r.stderr)
		}
	}
}

// TestPostgresURLMistakes are usage errors (exit 2), password redacted.
func TestPostgresURLMistakes(t *testing.T) {
	const secret = "hunter2-s3cret"
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--large", "pglo"}, "needs --kv postgres://"},
		{[]string{"--kv", "postgres://alice:" + secret + "@127.0.0.1:notaport/db"}, "invalid PostgreSQL DSN"},
		{[]string{"--large", "pglo:postgres://alice:" + secret + "@h/db?sslmode=sometimes"}, "invalid PostgreSQL DSN"},
		{[]string{"--large", "postgres://alice:" + secret + "@h/db"}, "kv-tier engine"},
		{[]string{"--kv", "pglo:postgres://alice:" + secret + "@h/db"}, "large-tier engine"},
		{[]string{"--kv", "host=h user=alice password=" + secret + " dbname=db"}, "unknown engine"},
	} {
		r := newCLI(t, tc.flags...).fail(2, tc.want, "ls")
		if strings.Contains(r.stderr, secret) || strings.Contains(r.stderr, url.QueryEscape(secret)) {
			t.Errorf("%v: stderr shows the password: %q", tc.flags, r.stderr)
		}
	}
}
