//go:build linux

package damage

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// rot changes one byte of the local tier's file of digest in place, as
// the medium would: same inode, and the chunk checksum no longer matches.
func rot(t *testing.T, data, digest string, off int64) {
	t.Helper()
	flipByte(t, filepath.Join(data, "large", "blobs", digest[:2], digest), off)
}

// TestCorruptRefusedEverywhere: once a scrub through the mount's control
// file finds a byte rotted in a local blob, the blob is refused the same
// way on every surface and by every process that opens the store: EIO
// through the mount, 500 over its HTTP surface, and an error with nothing
// written from get and cat run beside it. Putting the right content again
// repairs it everywhere.
func TestCorruptRefusedEverywhere(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "s")
	src, content, digest := clitest.WriteFile(t, t.TempDir(), 300<<10, 41) // the large tier
	c.OK("put", "--ns", "s", src)
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, "--listen", "127.0.0.1:0", "--insecure-loopback")
	url := dm.HTTPURL()
	p := filepath.Join(mnt, "s", digest)
	if got := clitest.FileSHA(t, p); got != digest {
		t.Fatalf("read before the rot: %s", got)
	}

	rot(t, c.Data, digest, 200_000)
	b := scrubOnce(t, mnt)
	var rep struct {
		Corrupt int64 `json:"corrupt"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || rep.Corrupt != 1 {
		t.Fatalf("scrub report %s: %v", b, err)
	}

	if _, err := os.ReadFile(p); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read through the mount of a blob a scrub found corrupt: %v; want EIO", err)
	}
	clitest.WantHTTPRefused(t, url, digest, c.Data)
	clitest.WantCLIRefused(t, c, digest)

	// The repair: the right content put again, by another process.
	c.OK("put", "--ns", "s", src)
	if got := c.OK("cat", digest); got != string(content) {
		t.Fatalf("cat after the repair: %d bytes", len(got))
	}
	if got := clitest.FileSHA(t, p); got != digest {
		t.Fatalf("read through the mount after the repair: %s", got)
	}
	if code := clitest.HTTPStatus(t, "GET", url+"/v1/blobs/"+digest); code != 200 {
		t.Fatalf("GET after the repair: %d", code)
	}
	clitest.StopDaemon(t, dm)
}

// scrubOnce runs a scrub through the mount's control file and returns its
// report, as the file reads after it.
func scrubOnce(t *testing.T, mnt string) []byte {
	t.Helper()
	scrub := filepath.Join(mnt, ".alkblobfs", "scrub")
	if err := os.WriteFile(scrub, []byte("run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(scrub)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
