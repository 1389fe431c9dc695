package fleet

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// The PostgreSQL engine URLs, end to end through the binary.

func TestRoundTripPostgresSameDatabase(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	clitest.RoundTrip(t, clitest.NewCLI(t, "--kv", dsn, "--large", "pglo"), true)
}

func TestRoundTripPglo(t *testing.T) {
	t.Parallel()
	// The default SQLite kv tier with large objects in PostgreSQL.
	clitest.RoundTrip(t, clitest.NewCLI(t, "--large", "pglo:"+pgtest.DSN(t)), true)
}

// TestPostgresUnreachable: a server that is not there is exit 1 with one
// line naming host:port, never the password.
func TestPostgresUnreachable(t *testing.T) {
	t.Parallel()
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
		r := clitest.NewCLI(t, flags...).Fail(1, addr, "ls")
		if strings.Contains(r.Stderr, secret) {
			t.Errorf("%v: stderr shows the password: %q", flags, r.Stderr)
		}
	}
}

// TestPostgresURLMistakes are usage errors (exit 2), password redacted.
func TestPostgresURLMistakes(t *testing.T) {
	t.Parallel()
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
		r := clitest.NewCLI(t, tc.flags...).Fail(2, tc.want, "ls")
		if strings.Contains(r.Stderr, secret) || strings.Contains(r.Stderr, url.QueryEscape(secret)) {
			t.Errorf("%v: stderr shows the password: %q", tc.flags, r.Stderr)
		}
	}
}

// TestPostgresSweepLease: the sweep lease is a session advisory lock held
// for one sweep. While another session holds it, sweep aborts with
// SweeperLock and deletes nothing; rm does not need it (each delete is
// arbitrated in its own transaction) and still refuses what a pin row of
// another process protects.
func TestPostgresSweepLease(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	c := clitest.NewCLI(t, "--kv", dsn, "--large", "pglo")
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("unreferenced"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.OK("put", src))
	c.OK("sweep") // stages d

	// Another process of the pool, through the engine's own GC state.
	other, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lease, got, err := other.Meta().Host.SweepLease(t.Context())
	if err != nil || !got {
		t.Fatalf("taking the lease in the test: %v, %v", got, err)
	}
	r := c.Run(nil, "sweep", "--json")
	if r.Code != 0 || !strings.Contains(r.Stdout, `"aborted": "SweeperLock"`) {
		t.Fatalf("sweep while the lease is held: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if out := c.OK("ls"); !strings.Contains(out, d) {
		t.Fatal("a refused sweep removed the blob")
	}
	// A foreign process's unexpired pin row refuses rm.
	dg := blob.MustParse(d)
	if err := other.Meta().Host.PinRows(t.Context(), "other-host:1:x", []blob.Digest{dg}, time.Hour); err != nil {
		t.Fatal(err)
	}
	c.Fail(1, "protected", "rm", d)
	if err := other.Meta().Host.DropOwner(t.Context(), "other-host:1:x"); err != nil {
		t.Fatal(err)
	}
	c.OK("rm", d)
	if out := c.OK("ls"); strings.Contains(out, d) {
		t.Fatal("rm left the blob")
	}
	lease.Release()
	if out := c.OK("sweep", "--json"); strings.Contains(out, "SweeperLock") {
		t.Fatalf("sweep after release still locked out:\n%s", out)
	}
}
