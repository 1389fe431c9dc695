//go:build linux

package fleet

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

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestFleetTwoMounts: two daemons in fleet mode on one PostgreSQL pool.
// A file written through A shows on B by digest within about a second; a
// file open on B survives A's rm and sweeps through A's control file and
// reads to its last byte; once B closes it, A's sweeps collect it.
func TestFleetTwoMounts(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	dsn := pgtest.DSN(t)
	flags := []string{"--kv", dsn, "--large", "pglo", "--fleet", "--pin-ttl", "3s"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	mntA, mntB := t.TempDir(), t.TempDir()
	dmA := clitest.StartDaemon(t, c.Data, mntA, flags...)
	dmB := clitest.StartDaemon(t, t.TempDir(), mntB, flags...)

	content := clitest.RandomBytes(8<<20, 77)
	d := clitest.Sum(content)
	if err := os.WriteFile(filepath.Join(mntA, "p", "incoming", "f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f := clitest.OpenWithin(t, filepath.Join(mntB, "p", d), 30*time.Second)
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
		clitest.SweepVia(t, mntA)
	}
	clitest.ReadsTo(t, f, head, d)
	f.Close()
	clitest.Collected(t, c, d, func() { clitest.SweepVia(t, mntA) })
	clitest.StopDaemon(t, dmA)
	clitest.StopDaemon(t, dmB)
}

// TestPostgresRestartUnderMount: a file open on a mount stays readable to
// its last byte across a PostgreSQL restart, followed by a CLI sweep and a
// second mount's sweeps. Its pin is a row, which the restart keeps; the
// sweep lease is per sweep, so nothing depends on a session lock the
// restart dropped.
func TestPostgresRestartUnderMount(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	srv := pgtest.FaultServer(t)
	flags := []string{"--kv", srv.DSN, "--large", "pglo", "--fleet"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	src := filepath.Join(t.TempDir(), "big")
	content := clitest.RandomBytes(8<<20, 5)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.OK("put", "--ns", "p", src))
	mntA := t.TempDir()
	dmA := clitest.StartDaemon(t, c.Data, mntA, flags...)
	f := clitest.OpenWithin(t, filepath.Join(mntA, "p", d), 30*time.Second)
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	c.OK("unlink", "p", d)

	srv.Restart(t)

	for range 2 {
		if out := c.OK("sweep", "--json"); strings.Contains(out, "SweeperLock") {
			t.Fatalf("sweep after the restart locked out:\n%s", out)
		}
	}
	mntB := t.TempDir()
	dmB := clitest.StartDaemon(t, t.TempDir(), mntB, flags...)
	for range 2 {
		clitest.SweepVia(t, mntB)
	}
	if out := c.OK("ls"); !strings.Contains(out, d) {
		t.Fatal("a blob open on mount A was deleted after the restart")
	}
	clitest.ReadsTo(t, f, head, d)
	f.Close()
	clitest.StopDaemon(t, dmB)
	clitest.StopDaemon(t, dmA)
}

// TestFleetFlags: fleet mode is declared and checked; its mistakes, and an
// overflowing window, are usage errors that change nothing.
func TestFleetFlags(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.Fail(2, "needs a PostgreSQL kv engine", "--fleet", "ls")
	c.Fail(2, "use it with --fleet", "--shared-media", "ls")
	c.Fail(2, "--gc-window", "--gc-window", "2102400h", "sweep")
	c.Fail(2, "--pin-ttl", "--pin-ttl", "0s", "ls")
	dsn := pgtest.DSN(t)
	clitest.NewCLI(t, "--kv", dsn, "--large", "mem:", "--fleet").Fail(2, "memory", "ls")
	clitest.NewCLI(t, "--kv", dsn, "--fleet").Fail(2, "--shared-media", "ls")
	clitest.NewCLI(t, "--kv", dsn, "--large", "pglo", "--fleet").OK("ls")
	clitest.NewCLI(t, "--kv", dsn, "--fleet", "--shared-media").OK("ls")
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
	c := clitest.NewCLI(t, "--kv", dsn, "--large", "pglo", "--fleet", "--liveness-table", "emb.Live Set")
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, clitest.RandomBytes(clitest.SmallSize, 9), 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.OK("put", src))
	key, _ := hex.DecodeString(d)
	if _, err := conn.Exec(t.Context(), `INSERT INTO emb."Live Set" VALUES ($1)`, key); err != nil {
		t.Fatal(err)
	}
	c.Fail(1, "protected", "rm", d)
	c.OK("sweep")
	c.OK("sweep")
	if !strings.Contains(c.OK("ls"), d) {
		t.Fatal("a blob named by the liveness table was swept")
	}
	if _, err := conn.Exec(t.Context(), `DELETE FROM emb."Live Set"`); err != nil {
		t.Fatal(err)
	}
	c.OK("rm", d)

	clitest.NewCLI(t, "--kv", dsn, "--liveness-table", "a.b.c").Fail(2, "SCHEMA.TABLE", "ls")
	clitest.NewCLI(t, "--kv", dsn, "--liveness-table", "nosuch").Fail(1, "liveness table", "ls")
	clitest.NewCLI(t, "--liveness-table", "x").Fail(1, "liveness table", "ls") // SQLite: no such table
}

// TestKVFile: --kv-file reads the PostgreSQL URL from a file, so that the
// password never shows in a process list, the daemon's included.
func TestKVFile(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
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
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, flags...)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", dm.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cmdline), pw) {
		t.Fatal("the daemon's command line shows the password")
	}
	if err := os.WriteFile(filepath.Join(mnt, "p", "incoming", "f"), []byte("via kv-file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := clitest.Lines(c.OK("ls", "p")); len(got) != 1 || got[0] != clitest.Sum([]byte("via kv-file")) {
		t.Fatalf("ls p = %v", got)
	}
	clitest.StopDaemon(t, dm)
	c.Fail(2, "give one", "--kv", dsn, "ls")
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
	c := clitest.NewCLI(t, "--kv", u.String(), "--large", "pglo")
	c.Env = []string{"PGPASSFILE=" + pass}
	c.OK("ns", "create", "p")
	if got := c.OK("ns", "ls"); got != "p\n" {
		t.Fatalf("ns ls = %q", got)
	}
}
