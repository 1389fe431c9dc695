//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// rot changes one byte of the local tier's file of digest in place, as
// the medium would: same inode, and the chunk checksum no longer matches.
func rot(t *testing.T, data, digest string, off int64) {
	t.Helper()
	flipByte(t, filepath.Join(data, "large", "blobs", digest[:2], digest), off)
}

// wantHTTPRefused checks that GET of digest from the server at url is
// refused as known corrupt: 500, before any byte of the blob, with a body
// that names the digest and no server path.
func wantHTTPRefused(t *testing.T, url, digest, data string) {
	t.Helper()
	resp, err := http.Get(url + "/v1/blobs/" + digest)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct{ Error string }
	if resp.StatusCode != http.StatusInternalServerError || json.Unmarshal(body, &e) != nil {
		t.Fatalf("GET of a blob a scrub found corrupt: %d %q; want 500 and a JSON error", resp.StatusCode, body)
	}
	if !strings.Contains(e.Error, "known corrupt") || !strings.Contains(e.Error, digest) ||
		strings.Contains(e.Error, data) || strings.Contains(e.Error, "/tmp") {
		t.Fatalf("GET refusal %q: want it to say known corrupt and name the digest, and no server path", e.Error)
	}
}

// wantCLIRefused checks that get and cat, separate processes beside the
// server that scrubbed, refuse digest up front: exit 1, one clear line,
// nothing on stdout, and no file left where -o pointed.
func wantCLIRefused(t *testing.T, c *cli, digest string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	for _, args := range [][]string{{"get", digest}, {"cat", digest}, {"get", digest, "-o", out}} {
		r := c.run(nil, args...)
		checkFail(t, r, 1, "known corrupt", args)
		if r.stdout != "" || !strings.Contains(r.stderr, digest) {
			t.Fatalf("alkblobfs %s: stdout %d bytes, stderr %q; want nothing on stdout and the digest named", strings.Join(args, " "), len(r.stdout), r.stderr)
		}
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("get -o of a corrupt blob left %s: %v", out, err)
	}
}

// TestCorruptRefusedEverywhere: once a scrub through the mount's control
// file finds a byte rotted in a local blob, the blob is refused the same
// way on every surface and by every process that opens the store: EIO
// through the mount, 500 over its HTTP surface, and an error with nothing
// written from get and cat run beside it. Putting the right content again
// repairs it everywhere.
func TestCorruptRefusedEverywhere(t *testing.T) {
	t.Parallel()
	requireFUSE(t)
	c := newCLI(t)
	c.ok("ns", "create", "s")
	src, content, digest := writeFile(t, t.TempDir(), 300<<10, 41) // the large tier
	c.ok("put", "--ns", "s", src)
	mnt := t.TempDir()
	dm := startDaemon(t, c.data, mnt, "--listen", "127.0.0.1:0", "--insecure-loopback")
	url := dm.httpURL()
	p := filepath.Join(mnt, "s", digest)
	if got := fileSHA(t, p); got != digest {
		t.Fatalf("read before the rot: %s", got)
	}

	rot(t, c.data, digest, 200_000)
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
	wantHTTPRefused(t, url, digest, c.data)
	wantCLIRefused(t, c, digest)

	// The repair: the right content put again, by another process.
	c.ok("put", "--ns", "s", src)
	if got := c.ok("cat", digest); got != string(content) {
		t.Fatalf("cat after the repair: %d bytes", len(got))
	}
	if got := fileSHA(t, p); got != digest {
		t.Fatalf("read through the mount after the repair: %s", got)
	}
	if code := httpStatus(t, "GET", url+"/v1/blobs/"+digest); code != 200 {
		t.Fatalf("GET after the repair: %d", code)
	}
	stopDaemon(t, dm)
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
