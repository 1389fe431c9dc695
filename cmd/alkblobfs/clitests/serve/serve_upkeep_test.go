//go:build linux

package serve

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestServeSweepEvery: serve --sweep-every collects a blob that nothing
// keeps any more (its namespace dropped it, its pin token was released)
// with no sweep run by hand; with --sweep-every 0, the default, nothing
// sweeps.
func TestServeSweepEvery(t *testing.T) {
	t.Parallel()
	for _, every := range []string{"1s", "0", "default"} {
		t.Run(every, func(t *testing.T) {
			c := clitest.NewCLI(t)
			c.OK("ns", "create", "builds")
			args := []string{"--listen", "127.0.0.1:0", "--insecure-loopback"}
			if every != "default" {
				args = append(args, "--sweep-every", every)
			}
			s := clitest.StartServe(t, c, args...)

			content := clitest.RandomBytes(5000, 21)
			resp, err := http.Post(s.URL+"/v1/blobs?namespace=builds", "application/octet-stream", bytes.NewReader(content))
			if err != nil {
				t.Fatal(err)
			}
			var put struct{ Token, Digest string }
			err = json.NewDecoder(resp.Body).Decode(&put)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 201 || put.Digest != clitest.Sum(content) {
				t.Fatalf("put: %d %+v %v", resp.StatusCode, put, err)
			}
			if code := clitest.HTTPStatus(t, "DELETE", s.URL+"/v1/pins/"+put.Token); code != 204 {
				t.Fatalf("release the pin: %d", code)
			}
			c.OK("unlink", "builds", put.Digest)
			blobURL := s.URL + "/v1/blobs/" + put.Digest

			if every != "1s" {
				// Long enough for a 1s timer to have collected it (the
				// test above does within about 2 s).
				time.Sleep(4 * time.Second)
				if code := clitest.HTTPStatus(t, "GET", blobURL); code != 200 {
					t.Fatalf("with --sweep-every 0 the blob went: GET %d", code)
				}
				if strings.Contains(s.Stderr.String(), "sweep done") {
					t.Fatalf("serve swept with --sweep-every 0:\n%s", s.Stderr.String())
				}
				return
			}
			// SQLite's window is durable: one sweep stages, the next
			// deletes.
			clitest.Eventually(t, 20*time.Second, "the timer to collect the blob", func() bool {
				return clitest.HTTPStatus(t, "GET", blobURL) == 404
			})
			clitest.Eventually(t, 20*time.Second, "a timer sweep in serve's log", func() bool {
				return strings.Contains(s.Stderr.String(), `msg="sweep done" trigger=timer`)
			})
			// The blob is gone while its sweep still writes its report,
			// which is what the counter counts.
			clitest.Eventually(t, 20*time.Second, "alkblobfs_sweeps_total to count the timer's two sweeps", func() bool {
				return clitest.MetricValue(clitest.ScrapeMetrics(t, s.URL), "alkblobfs_sweeps_total", "") >= 2
			})
		})
	}
}

// TestServeScrubEvery: serve --scrub-every re-reads the blobs from disk
// and logs one it finds corrupt (and counts it in /metrics), and a scrub in progress ends when the
// server is told to stop.
func TestServeScrubEvery(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "s")
	src, _, digest := clitest.WriteFile(t, t.TempDir(), 300<<10, 22) // the large tier: a file
	c.OK("put", "--ns", "s", src)

	t.Run("finds rot", func(t *testing.T) {
		f, err := os.OpenFile(filepath.Join(c.Data, "large", "blobs", digest[:2], digest), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		// A byte changed in place, as the medium would.
		if _, err := f.WriteAt([]byte{'x'}, 1000); err != nil {
			t.Fatal(err)
		}
		f.Close()
		s := clitest.StartServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-every", "1s")
		clitest.Eventually(t, 20*time.Second, "a timed scrub to find the rot", func() bool {
			log := s.Stderr.String()
			return strings.Contains(log, `msg="scrub: blob is corrupt" digest=`+digest) && strings.Contains(log, `msg="scrub done" trigger=timer`)
		})
		fams := clitest.ScrapeMetrics(t, s.URL)
		if runs, bad := clitest.MetricValue(fams, "alkblobfs_scrubs_total", ""), clitest.MetricValue(fams, "alkblobfs_scrub_found_bad_total", ""); runs < 1 || bad < 1 {
			t.Fatalf("metrics: %v scrubs, %v bad blobs", runs, bad)
		}
		// From then on serve refuses the blob, and so does every process
		// that opens the store.
		clitest.WantHTTPRefused(t, s.URL, digest, c.Data)
		clitest.WantCLIRefused(t, c, digest)
		s.Cmd.Process.Signal(syscall.SIGINT)
		<-s.Done
	})

	t.Run("stops with the server", func(t *testing.T) {
		// 10 kB/s: the scrub of 300 KiB takes half a minute.
		s := clitest.StartServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-every", "1s", "--scrub-rate", "0.01")
		clitest.Eventually(t, 20*time.Second, "a timed scrub to start", func() bool {
			return strings.Contains(s.Stderr.String(), `msg="scrub started" trigger=timer`)
		})
		s.Cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.Done:
		case <-time.After(10 * time.Second):
			t.Fatalf("serve did not stop during a scrub:\n%s", s.Stderr.String())
		}
		if code := s.Cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(s.Stderr.String(), `msg="scrub stopped early"`) {
			t.Fatalf("exit %d:\n%s", code, s.Stderr.String())
		}
	})
}

// TestServeUpkeepFlagsBound: serve checks --sweep-every, --scrub-every and
// --scrub-rate as mount does, before it listens.
func TestServeUpkeepFlagsBound(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.Fail(2, "at least 1s", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--sweep-every", "1ms")
	c.Fail(2, "at least 1s", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--sweep-every", "-1s")
	c.Fail(2, "at least 1s", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-every", "10ms")
	c.Fail(2, "scrub-rate", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-rate", "-1")
}

// TestServeTokenKeepsUnlinkedBlob: docs/http.md promises that a pin token
// keeps its blob even once no namespace links it, through a sweep another
// process runs. A small HTTP put on the embedded SQLite store links in its
// own transaction; its pin, which the token holds, must still have a row
// for the other process's sweeps to see (store.ReleasesPinAtOnce is for
// callers that drop the pin at once, not for this one).
func TestServeTokenKeepsUnlinkedBlob(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	s := clitest.StartServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback")

	content := clitest.RandomBytes(4096, 36)
	resp, err := http.Post(s.URL+"/v1/blobs?namespace=builds", "application/octet-stream", bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	var put struct{ Token, Digest string }
	err = json.NewDecoder(resp.Body).Decode(&put)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 201 || put.Token == "" || put.Digest != clitest.Sum(content) {
		t.Fatalf("put: %d %+v %v", resp.StatusCode, put, err)
	}
	// No namespace links it now: only the token keeps it.
	c.OK("unlink", "builds", put.Digest)
	// The durable window: the first sweep stages, the second deletes what
	// nothing protects.
	for i := range 2 {
		var rep struct {
			Deleted int
			Aborted string
		}
		if err := json.Unmarshal([]byte(c.OK("--gc-window", "0", "sweep", "--json")), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Aborted != "" {
			t.Fatalf("sweep %d aborted: %s", i+1, rep.Aborted)
		}
		if rep.Deleted != 0 {
			t.Fatalf("sweep %d in another process deleted %d blobs while a pin token held one", i+1, rep.Deleted)
		}
	}
	resp, err = http.Get(s.URL + "/v1/blobs/" + put.Digest)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	got.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got.Bytes(), content) {
		t.Fatalf("a blob its live pin token keeps, after two sweeps by another process: GET %d (%d bytes)", resp.StatusCode, got.Len())
	}
	c.OK("stat", put.Digest)
	// Released, the token no longer keeps it: the next sweeps take it.
	if code := clitest.HTTPStatus(t, "DELETE", s.URL+"/v1/pins/"+put.Token); code != 204 {
		t.Fatalf("release the pin: %d", code)
	}
}
