//go:build linux

package clitest

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WantHTTPRefused checks that GET of digest from the server at url is
// refused as known corrupt: 500, before any byte of the blob, with a body
// that names the digest and no server path.
func WantHTTPRefused(t *testing.T, url, digest, data string) {
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

// WantCLIRefused checks that get and cat, separate processes beside the
// Server that scrubbed, refuse digest up front: exit 1, one clear line,
// nothing on stdout, and no file left where -o pointed.
func WantCLIRefused(t *testing.T, c *CLI, digest string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	for _, args := range [][]string{{"get", digest}, {"cat", digest}, {"get", digest, "-o", out}} {
		r := c.Run(nil, args...)
		CheckFail(t, r, 1, "known corrupt", args)
		if r.Stdout != "" || !strings.Contains(r.Stderr, digest) {
			t.Fatalf("alkblobfs %s: stdout %d bytes, stderr %q; want nothing on stdout and the digest named", strings.Join(args, " "), len(r.Stdout), r.Stderr)
		}
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("get -o of a corrupt blob left %s: %v", out, err)
	}
}
