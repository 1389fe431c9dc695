//go:build linux

package fleet

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// TestClockSkewProcesses: a mount whose clock runs 5 minutes slow holds a
// file open; commands whose clock runs 5 minutes fast (ALKBLOBFS_CLOCK_SKEW)
// rm it and sweep, on one PostgreSQL pool, for over two TTLs. The file is
// never deleted under the reader, who reads it to its last byte; once it is
// closed, the fast sweeps collect it within TTL + window. The pin row is
// timed by the server's clock: neither process's clock says anything about
// it.
func TestClockSkewProcesses(t *testing.T) {
	// Not parallel: it bounds the collection after the close.
	clitest.RequireFUSE(t)
	const ttl, window = 3 * time.Second, time.Second
	dsn := pgtest.DSN(t)
	flags := []string{"--kv", dsn, "--large", "pglo", "--fleet", "--pin-ttl", ttl.String(), "--gc-window", window.String()}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	src := filepath.Join(t.TempDir(), "big")
	content := clitest.RandomBytes(8<<20, 41)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.OK("put", "--ns", "p", src))

	mnt := t.TempDir()
	dm := clitest.StartDaemonEnv(t, []string{clockSkewEnv + "=-5m"}, c.Data, mnt, flags...)
	f := clitest.OpenWithin(t, filepath.Join(mnt, "p", d), 30*time.Second)
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}

	c.Env = []string{clockSkewEnv + "=+5m"}
	c.OK("unlink", "p", d)
	for start := time.Now(); time.Since(start) < 2*ttl+window; time.Sleep(200 * time.Millisecond) {
		c.Fail(1, "protected", "rm", d)
		c.OK("sweep")
		if !strings.Contains(c.OK("ls"), d) {
			t.Fatalf("a sweep 10 min ahead of the mount deleted the file open there, %s after the unlink", time.Since(start).Round(time.Millisecond))
		}
	}
	clitest.ReadsTo(t, f, head, d)
	f.Close()
	if took := clitest.Collected(t, c, d, func() { c.OK("sweep") }); took > ttl+window+5*time.Second {
		t.Fatalf("the closed file was collected %s after its close; want about TTL + window (%s)", took, ttl+window)
	}
	clitest.StopDaemon(t, dm)
}

// TestClockSkewEnv: the knob takes a Go duration; anything else is a
// usage error.
func TestClockSkewEnv(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.Env = []string{clockSkewEnv + "=+5m"}
	c.OK("ls")
	c.Env = []string{clockSkewEnv + "=soon"}
	c.Fail(2, clockSkewEnv, "ls")
}
