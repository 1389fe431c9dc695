//go:build linux

package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// settleFailed is what a mount logs when the settle of a RELEASE fails
// (fusefs fileNode.settle); the lease retries it.
const settleFailed = "could not link a closed file into its namespace; retrying"

// TestCloseThenSettleCut: a close returns 0 (its FLUSH committed the file
// and its intent), and the RELEASE that follows it — the settle that
// links the file — reaches the daemon while the host's path to
// PostgreSQL is reset, so that settle fails. Right after the close the
// file is not listed: this is the window TestFleetAcceptance's "close
// returned 0 but not linked" fell into, whose RELEASE raced the proxy's
// Restore. Once the path is back, the lease's retry links it, within a
// bound of a few lease ticks (TTL/3). A second descriptor (dup) holds the
// open file, so that the first close sends the FLUSH alone and the cut
// lands exactly between the FLUSH and the RELEASE. Both tiers: a small
// file (kv, its intent in the put's transaction) and a large one (pglo,
// its intent after the stage's commit).
func TestCloseThenSettleCut(t *testing.T) {
	// Not parallel: its files open on the mount must see no close but its
	// own, and another test's fork and exec closes copies of them (a FLUSH each).
	clitest.RequireFUSE(t)
	dsn := pgtest.DSN(t)
	c := clitest.NewCLI(t, fleetFlags(t, dsn, "pglo", nil)...)
	c.OK("ns", "create", "p")
	a := startSkewHost(t, "A", "", dsn, "pglo")
	for i, size := range []int{3000, 2 << 20} {
		content := clitest.RandomBytes(size, uint64(700+i))
		d := clitest.Sum(content)
		f, err := os.Create(filepath.Join(a.mnt, "p", "incoming", fmt.Sprintf("f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(content); err != nil {
			t.Fatal(err)
		}
		fd2, err := syscall.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil { // the FLUSH: commits, with the intent
			t.Fatalf("%d bytes: close: %v", size, err)
		}
		failed := strings.Count(a.dm.Stderr.String(), settleFailed)
		a.proxy.Reset()
		if err := syscall.Close(fd2); err != nil { // nothing new to commit; then the RELEASE
			t.Fatalf("%d bytes: the last close: %v", size, err)
		}
		clitest.Eventually(t, 10*time.Second, "the RELEASE's settle to fail through the reset proxy", func() bool {
			return strings.Count(a.dm.Stderr.String(), settleFailed) > failed
		})
		if slices.Contains(clitest.Lines(c.OK("ls", "p")), d) {
			t.Fatalf("%d bytes: linked although its settle failed", size)
		}
		a.proxy.Restore()
		back := time.Now()
		clitest.Eventually(t, 10*time.Second, fmt.Sprintf("%d bytes, whose close returned 0, to be linked once the settle is retried", size), func() bool {
			return slices.Contains(clitest.Lines(c.OK("ls", "p")), d)
		})
		t.Logf("%d bytes: linked %s after the path came back", size, time.Since(back).Round(time.Millisecond))
		if got := clitest.FileSHA(t, filepath.Join(a.mnt, "p", d)); got != d {
			t.Fatalf("%d bytes: %s reads back as %s", size, d, got)
		}
	}
	clitest.StopDaemon(t, a.dm)
}
