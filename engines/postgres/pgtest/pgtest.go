// Package pgtest gives tests a PostgreSQL database of their own on the
// throw-away servers scripts/pg.sh starts (make test runs every test under
// it).
//
// Without a server (ALKBLOBFS_PG_DSN empty) a test that asks for one is
// skipped with a message, unless ALKBLOBFS_REQUIRE_PG=1 — pg.sh sets it —
// turns the skip into a failure, so CI cannot go green by skipping.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alkblobfs/alkblobfs/engines/enginetest/faultctl"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
)

// Environment set by scripts/pg.sh.
const (
	EnvDSN       = "ALKBLOBFS_PG_DSN"
	EnvRequire   = "ALKBLOBFS_REQUIRE_PG"
	EnvFaultDSN  = "ALKBLOBFS_PG_FAULT_DSN"
	EnvFaultCtl  = "ALKBLOBFS_PG_FAULT_CTL"
	EnvFaultLock = "ALKBLOBFS_PG_FAULT_LOCK"
	EnvOSUser    = "ALKBLOBFS_PG_OSUSER"
)

// DSN returns the DSN of a new, empty database on the shared test server.
// The database is dropped when t ends. Tests never see each other's
// tables or large objects.
func DSN(t testing.TB) string {
	t.Helper()
	return freshDB(t, need(t, EnvDSN))
}

// Available reports whether a test server is configured.
func Available() bool { return os.Getenv(EnvDSN) != "" }

// need returns the environment variable or skips (fails under
// ALKBLOBFS_REQUIRE_PG=1).
func need(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v != "" {
		return v
	}
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s is empty but %s=1: run the tests under scripts/pg.sh (make test does)", env, EnvRequire)
	}
	t.Skipf("no PostgreSQL test server (%s is empty): run under scripts/pg.sh, as make test does", env)
	return ""
}

var (
	adminsMu sync.Mutex
	admins   = map[string]*pgxpool.Pool{}
)

// admin is a small pool on the server's maintenance database, shared by
// every test in the process; it is never closed (the process exits).
func admin(t testing.TB, base string) *pgxpool.Pool {
	t.Helper()
	adminsMu.Lock()
	defer adminsMu.Unlock()
	if p := admins[base]; p != nil {
		return p
	}
	// postgres.Connect, not a bare pool: its pool drops connections a
	// fault test's restart killed, so cleanups work right after one.
	u, _ := url.Parse(withDB(t, base, "postgres"))
	q := u.Query()
	q.Set("pool_max_conns", "2")
	u.RawQuery = q.Encode()
	p, _, err := postgres.Connect(context.Background(), u.String())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	admins[base] = p
	return p
}

// withDB returns dsn (a URL) naming database db instead.
func withDB(t testing.TB, dsn, db string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("pgtest: the server DSN must be a postgres:// URL")
	}
	u.Path = "/" + db
	return u.String()
}

// freshDB creates a database on base's server and returns its DSN.
func freshDB(t testing.TB, base string) string {
	t.Helper()
	return createDB(t, base, "")
}

// TablespaceDSN returns the DSN of a new, empty database on the shared
// test server whose files (tables, large objects, catalogs) live in dir,
// an empty directory, through a tablespace: a test that puts dir on a
// small filesystem fills the database's disk without touching the
// server's WAL, which stays in its own directory (a full WAL disk would
// stop the server). dir is handed to the server's system user. The
// database and the tablespace are dropped when t ends.
func TablespaceDSN(t testing.TB, dir string) string {
	t.Helper()
	base := need(t, EnvDSN)
	if u := os.Getenv(EnvOSUser); u != "" {
		if out, err := exec.Command("chown", u, dir).CombinedOutput(); err != nil {
			t.Fatalf("pgtest: chown %s %s: %v: %s", u, dir, err, out)
		}
	}
	return createDB(t, base, dir)
}

// createDB creates a database with a random name on base's server, in a
// tablespace of its own at dir unless dir is "", drops both when t ends,
// and returns the database's DSN.
func createDB(t testing.TB, base, dir string) string {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	name := "t_" + strings.ToLower(hex.EncodeToString(b[:]))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := admin(t, base)
	create := "CREATE DATABASE " + name
	if dir != "" {
		if _, err := p.Exec(ctx, "CREATE TABLESPACE "+name+" LOCATION '"+strings.ReplaceAll(dir, "'", "''")+"'"); err != nil {
			t.Fatalf("pgtest: create tablespace in %s: %v", dir, err)
		}
		create += " TABLESPACE " + name
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// FORCE: a test that failed may have left connections open.
		if _, err := p.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: drop database %s: %v", name, err)
		}
		if dir == "" {
			return
		}
		if _, err := p.Exec(ctx, "DROP TABLESPACE IF EXISTS "+name); err != nil {
			t.Logf("pgtest: drop tablespace %s: %v", name, err)
		}
	}
	if _, err := p.Exec(ctx, create); err != nil {
		drop()
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(drop)
	return withDB(t, base, name)
}

// Fault is a server that a test may stop and restart: its own copy, so the
// rest of the suite, running in parallel in other test binaries, is not
// disturbed. Fault tests serialize on a lock file across processes.
type Fault struct {
	// DSN names a fresh database on the fault server.
	DSN              string
	*faultctl.Server // Stop, Start, Restart
}

// FaultServer returns the fault server, holding its lock until t ends
// (faultctl.Take). At the end of the test the server is started again if
// the test left it stopped.
func FaultServer(t testing.TB) *Fault {
	t.Helper()
	base := need(t, EnvFaultDSN)
	srv := faultctl.Take(t, need(t, EnvFaultCtl), need(t, EnvFaultLock))
	return &Fault{DSN: freshDB(t, base), Server: srv}
}

// Warm leaves n connections idle in pool (opening them if needed), so a
// test can check what happens to idle connections across a restart.
func Warm(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatalf("pgtest: warm pool: %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if idle := pool.Stat().IdleConns(); idle < int32(n) {
		t.Fatalf("pgtest: warm pool: %d idle connections, want %d", idle, n)
	}
}
