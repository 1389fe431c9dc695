package fusefs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// TestPostgresOutage: while the PostgreSQL server is down, a mount on
// postgres+pglo answers EIO (with a log line) and publishes nothing half
// written; once the server is back, the next operations succeed on the
// same mount, without restarting anything.
func TestPostgresOutage(t *testing.T) {
	requireFUSE(t)
	srv := pgtest.FaultServer(t)
	data := t.TempDir()
	e := mountOn(t, data, pgConfig(t, srv.DSN, data))
	e.mkns("p")
	small, large := randBytes(41, 2000), randBytes(42, 3<<20)
	ds, dl := e.put("p", small), e.put("p", large)

	srv.Stop(t)
	// Reads of blobs not yet in the kernel's cache need the server.
	for _, d := range []string{ds.String(), dl.String()} {
		_, err := os.ReadFile(e.path("p", d))
		wantErrno(t, "read during the outage", err, syscall.EIO)
	}
	// A publish during the outage fails at close and leaves nothing.
	err := os.WriteFile(e.path("p", "incoming", "down.bin"), randBytes(43, 1<<20), 0o644)
	wantErrno(t, "publish during the outage", err, syscall.EIO)
	if !strings.Contains(e.logs.String(), "postgres") {
		t.Errorf("no log line naming the engine:\n%s", e.logs.String())
	}

	srv.Start(t)
	for _, d := range []string{ds.String(), dl.String()} {
		got, err := os.ReadFile(e.path("p", d))
		if err != nil || sum(got) != d {
			t.Fatalf("read after the server came back: %v", err)
		}
	}
	fresh := randBytes(44, 2<<20)
	writeFile(t, filepath.Join(e.path("p", "incoming"), "up.bin"), fresh)
	e.expectNS(t, "p", []string{ds.String(), dl.String(), sum(fresh)})

	// A restart (not a stop) between operations: stale pooled connections
	// are dropped, the next operation just works.
	srv.Restart(t)
	if got, err := os.ReadFile(e.path("p", sum(fresh))); err != nil || sum(got) != sum(fresh) {
		t.Fatalf("read after a restart: %v", err)
	}
}
