package postgres_test

import (
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/enginetest"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

func TestEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engines.Engine { return open(t, pgtest.DSN(t)) })
}

func open(t *testing.T, dsn string) *postgres.Engine {
	t.Helper()
	e, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestReopen: blobs are durable across a close (the delete window:
// meta's TestPostgresReopen).
func TestReopen(t *testing.T) {
	dsn := pgtest.DSN(t)
	enginetest.Reopen(t, func(t *testing.T) engines.Engine { return open(t, dsn) })
}

func password(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		t.Fatal("the test DSN has no password")
	}
	return pw
}

// TestOpenErrors: a bad DSN, a closed port and a wrong password each give
// one line that names the server (where there is one) and never the
// password.
func TestOpenErrors(t *testing.T) {
	const secret = "s3cr%65t-pw" // "%65" decodes to "e": both forms must stay hidden
	port := closedPort(t)
	for _, tc := range []struct {
		name, dsn string
		want      []string
	}{
		{"closed port", "postgres://alice:" + secret + "@127.0.0.1:" + port + "/db?sslmode=disable&connect_timeout=5",
			[]string{"127.0.0.1:" + port, "cannot connect", "refused"}},
		{"bad port", "postgres://alice:" + secret + "@127.0.0.1:notaport/db", []string{"invalid PostgreSQL DSN"}},
		{"bad option", "postgres://alice:" + secret + "@127.0.0.1:" + port + "/db?sslmode=sometimes", []string{"invalid PostgreSQL DSN", "sslmode"}},
		{"key=value", "host=127.0.0.1 port=" + port + " user=alice password=" + secret + " dbname=db sslmode=disable connect_timeout=5",
			[]string{"127.0.0.1:" + port}},
		{"password query", "postgres://127.0.0.1:" + port + "/db?user=alice&password=" + secret + "&sslmode=disable&connect_timeout=5",
			[]string{"127.0.0.1:" + port}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := postgres.Open(t.Context(), tc.dsn)
			if err == nil {
				t.Fatal("Open succeeded")
			}
			checkSecret(t, err, secret, tc.want...)
		})
	}
	if pgtest.Available() {
		t.Run("wrong password", func(t *testing.T) {
			u, _ := url.Parse(pgtest.DSN(t))
			u.User = url.UserPassword(u.User.Username(), secret)
			_, err := postgres.Open(t.Context(), u.String())
			if err == nil {
				t.Fatal("Open with a wrong password succeeded")
			}
			checkSecret(t, err, secret, u.Host, "password authentication failed")
		})
	}
}

func checkSecret(t *testing.T, err error, secret string, want ...string) {
	t.Helper()
	msg := err.Error()
	t.Logf("error: %s", msg)
	dec, _ := url.PathUnescape(secret)
	if strings.Contains(msg, secret) || strings.Contains(msg, dec) {
		t.Errorf("error shows the password: %s", msg)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error does not say %q: %s", w, msg)
		}
	}
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}
