//go:build linux

package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestFleetTwoMounts: two daemons in fleet mode on one PostgreSQL pool.
// A file written through A shows on B by digest within about a second; a
// file open on B survives A's rm and sweeps through A's control file and
// reads to its last byte; once B closes it, A's sweeps collect it.
func TestFleetTwoMounts(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	dsn := pgtest.DSN(t)
	flags := []string{"--kv", dsn, "--large", "pglo", "--fleet", "--pin-ttl", "3s"}
	c := newCLI(t, flags...)
	c.ok("ns", "create", "p")
	mntA, mntB := t.TempDir(), t.TempDir()
	dmA := startDaemon(t, c.data, mntA, flags...)
	dmB := startDaemon(t, t.TempDir(), mntB, flags...)

	content := randomBytes(8<<20, 77)
	d := sum(content)
	if err := os.WriteFile(filepath.Join(mntA, "p", "incoming", "f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f := openWithin(t, filepath.Join(mntB, "p", d), 30*time.Second)
	defer f.Close()
	t.Logf("written through A, open on B after %s", time.Since(start).Round(time.Millisecond))
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mntA, "p", d)); err != nil {
		t.Fatalf("rm through A: %v", err)
	}
	for range 2 {
		sweepVia(t, mntA)
	}
	readsTo(t, f, head, d)
	f.Close()
	collected(t, c, d, func() { sweepVia(t, mntA) })
	stopDaemon(t, dmA)
	stopDaemon(t, dmB)
}

// TestPostgresRestartUnderMount: a file open on a mount stays readable to
// its last byte across a PostgreSQL restart, followed by a CLI sweep and a
// second mount's sweeps. Its pin is a row, which the restart keeps; the
// sweep lease is per sweep, so nothing depends on a session lock the
// restart dropped.
func TestPostgresRestartUnderMount(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	srv := pgtest.FaultServer(t)
	flags := []string{"--kv", srv.DSN, "--large", "pglo", "--fleet"}
	c := newCLI(t, flags...)
	c.ok("ns", "create", "p")
	src := filepath.Join(t.TempDir(), "big")
	content := randomBytes(8<<20, 5)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.ok("put", "--ns", "p", src))
	mntA := t.TempDir()
	dmA := startDaemon(t, c.data, mntA, flags...)
	f := openWithin(t, filepath.Join(mntA, "p", d), 30*time.Second)
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	c.ok("unlink", "p", d)

	srv.Restart(t)

	for range 2 {
		if out := c.ok("sweep", "--json"); strings.Contains(out, "SweeperLock") {
			t.Fatalf("sweep after the restart locked out:\n%s", out)
		}
	}
	mntB := t.TempDir()
	dmB := startDaemon(t, t.TempDir(), mntB, flags...)
	for range 2 {
		sweepVia(t, mntB)
	}
	if out := c.ok("ls"); !strings.Contains(out, d) {
		t.Fatal("a blob open on mount A was deleted after the restart")
	}
	readsTo(t, f, head, d)
	f.Close()
	stopDaemon(t, dmB)
	stopDaemon(t, dmA)
}

// TestFleetFlags: fleet mode is declared and checked; its mistakes, and an
// overflowing window, are usage errors that change nothing.
func TestFleetFlags(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.fail(2, "needs a PostgreSQL kv engine", "--fleet", "ls")
	c.fail(2, "use it with --fleet", "--shared-media", "ls")
	c.fail(2, "--gc-window", "--gc-window", "2102400h", "sweep")
	c.fail(2, "--pin-ttl", "--pin-ttl", "0s", "ls")
	dsn := pgtest.DSN(t)
	newCLI(t, "--kv", dsn, "--large", "mem:", "--fleet").fail(2, "memory", "ls")
	newCLI(t, "--kv", dsn, "--fleet").fail(2, "--shared-media", "ls")
	newCLI(t, "--kv", dsn, "--large", "pglo", "--fleet").ok("ls")
	newCLI(t, "--kv", dsn, "--fleet", "--shared-media").ok("ls")
}

// TestLivenessTable: a table the embedder keeps in the shared database,
// named with --liveness-table (quoted: any case, any character), keeps the
// digests in its digest column alive against rm and sweeps from every
// process; the store only reads it.
func TestLivenessTable(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), `CREATE SCHEMA emb; CREATE TABLE emb."Live Set" (digest bytea NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t, "--kv", dsn, "--large", "pglo", "--fleet", "--liveness-table", "emb.Live Set")
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, randomBytes(smallSize, 9), 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.ok("put", src))
	key, _ := hex.DecodeString(d)
	if _, err := conn.Exec(t.Context(), `INSERT INTO emb."Live Set" VALUES ($1)`, key); err != nil {
		t.Fatal(err)
	}
	c.fail(1, "protected", "rm", d)
	c.ok("sweep")
	c.ok("sweep")
	if !strings.Contains(c.ok("ls"), d) {
		t.Fatal("a blob named by the liveness table was swept")
	}
	if _, err := conn.Exec(t.Context(), `DELETE FROM emb."Live Set"`); err != nil {
		t.Fatal(err)
	}
	c.ok("rm", d)

	newCLI(t, "--kv", dsn, "--liveness-table", "a.b.c").fail(2, "SCHEMA.TABLE", "ls")
	newCLI(t, "--kv", dsn, "--liveness-table", "nosuch").fail(1, "liveness table", "ls")
	newCLI(t, "--liveness-table", "x").fail(1, "liveness table", "ls") // SQLite: no such table
}

// TestKVFile: --kv-file reads the PostgreSQL URL from a file, so that the
// password never shows in a process list, the daemon's included.
func TestKVFile(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		t.Fatal("the test server's DSN has no password")
	}
	file := filepath.Join(t.TempDir(), "kv-url")
	if err := os.WriteFile(file, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--kv-file", file, "--large", "pglo"}
	c := newCLI(t, flags...)
	c.ok("ns", "create", "p")
	mnt := t.TempDir()
	dm := startDaemon(t, c.data, mnt, flags...)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", dm.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cmdline), pw) {
		t.Fatal("the daemon's command line shows the password")
	}
	if err := os.WriteFile(filepath.Join(mnt, "p", "incoming", "f"), []byte("via kv-file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := lines(c.ok("ls", "p")); len(got) != 1 || got[0] != sum([]byte("via kv-file")) {
		t.Fatalf("ls p = %v", got)
	}
	stopDaemon(t, dm)
	c.fail(2, "give one", "--kv", dsn, "ls")
}

// TestPGPassFile: a URL without its password works when PGPASSFILE names
// a password file in PostgreSQL's format.
func TestPGPassFile(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	pass := filepath.Join(t.TempDir(), "pgpass")
	line := fmt.Sprintf("%s:%s:%s:%s:%s\n", u.Hostname(), u.Port(), strings.TrimPrefix(u.Path, "/"), u.User.Username(), pw)
	if err := os.WriteFile(pass, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	u.User = url.User(u.User.Username())
	c := newCLI(t, "--kv", u.String(), "--large", "pglo")
	c.env = []string{"PGPASSFILE=" + pass}
	c.ok("ns", "create", "p")
	if got := c.ok("ns", "ls"); got != "p\n" {
		t.Fatalf("ns ls = %q", got)
	}
}
