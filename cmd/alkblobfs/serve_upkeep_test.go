//go:build linux

package main

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
)

// httpStatus is the status of a request to the server at url.
func httpStatus(t *testing.T, method, url string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestServeSweepEvery: serve --sweep-every collects a blob that nothing
// keeps any more (its namespace dropped it, its pin token was released)
// with no sweep run by hand; with --sweep-every 0, the default, nothing
// sweeps.
func TestServeSweepEvery(t *testing.T) {
	t.Parallel()
	for _, every := range []string{"1s", "0", "default"} {
		t.Run(every, func(t *testing.T) {
			c := newCLI(t)
			c.ok("ns", "create", "builds")
			args := []string{"--listen", "127.0.0.1:0", "--insecure-loopback"}
			if every != "default" {
				args = append(args, "--sweep-every", every)
			}
			s := startServe(t, c, args...)

			content := randomBytes(5000, 21)
			resp, err := http.Post(s.url+"/v1/blobs?namespace=builds", "application/octet-stream", bytes.NewReader(content))
			if err != nil {
				t.Fatal(err)
			}
			var put struct{ Token, Digest string }
			err = json.NewDecoder(resp.Body).Decode(&put)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 201 || put.Digest != sum(content) {
				t.Fatalf("put: %d %+v %v", resp.StatusCode, put, err)
			}
			if code := httpStatus(t, "DELETE", s.url+"/v1/pins/"+put.Token); code != 204 {
				t.Fatalf("release the pin: %d", code)
			}
			c.ok("unlink", "builds", put.Digest)
			blobURL := s.url + "/v1/blobs/" + put.Digest

			if every != "1s" {
				// Long enough for a 1s timer to have collected it (the
				// test above does within about 2 s).
				time.Sleep(4 * time.Second)
				if code := httpStatus(t, "GET", blobURL); code != 200 {
					t.Fatalf("with --sweep-every 0 the blob went: GET %d", code)
				}
				if strings.Contains(s.stderr.String(), "sweep done") {
					t.Fatalf("serve swept with --sweep-every 0:\n%s", s.stderr.String())
				}
				return
			}
			// SQLite's window is durable: one sweep stages, the next
			// deletes.
			eventually(t, 20*time.Second, "the timer to collect the blob", func() bool {
				return httpStatus(t, "GET", blobURL) == 404
			})
			eventually(t, 20*time.Second, "a timer sweep in serve's log", func() bool {
				return strings.Contains(s.stderr.String(), `msg="sweep done" trigger=timer`)
			})
			// The blob is gone while its sweep still writes its report,
			// which is what the counter counts.
			eventually(t, 20*time.Second, "alkblobfs_sweeps_total to count the timer's two sweeps", func() bool {
				return metricValue(scrapeMetrics(t, s.url), "alkblobfs_sweeps_total", "") >= 2
			})
		})
	}
}

// TestServeScrubEvery: serve --scrub-every re-reads the blobs from disk
// and logs one it finds corrupt (and counts it in /metrics), and a scrub in progress ends when the
// server is told to stop.
func TestServeScrubEvery(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.ok("ns", "create", "s")
	src, _, digest := writeFile(t, t.TempDir(), 300<<10, 22) // the large tier: a file
	c.ok("put", "--ns", "s", src)

	t.Run("finds rot", func(t *testing.T) {
		f, err := os.OpenFile(filepath.Join(c.data, "large", "blobs", digest[:2], digest), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		// A byte changed in place, as the medium would.
		if _, err := f.WriteAt([]byte{'x'}, 1000); err != nil {
			t.Fatal(err)
		}
		f.Close()
		s := startServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-every", "1s")
		eventually(t, 20*time.Second, "a timed scrub to find the rot", func() bool {
			log := s.stderr.String()
			return strings.Contains(log, `msg="scrub: blob is corrupt" digest=`+digest) && strings.Contains(log, `msg="scrub done" trigger=timer`)
		})
		fams := scrapeMetrics(t, s.url)
		if runs, bad := metricValue(fams, "alkblobfs_scrubs_total", ""), metricValue(fams, "alkblobfs_scrub_found_bad_total", ""); runs < 1 || bad < 1 {
			t.Fatalf("metrics: %v scrubs, %v bad blobs", runs, bad)
		}
		// From then on serve refuses the blob, and so does every process
		// that opens the store.
		wantHTTPRefused(t, s.url, digest, c.data)
		wantCLIRefused(t, c, digest)
		s.cmd.Process.Signal(syscall.SIGINT)
		<-s.done
	})

	t.Run("stops with the server", func(t *testing.T) {
		// 10 kB/s: the scrub of 300 KiB takes half a minute.
		s := startServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-every", "1s", "--scrub-rate", "0.01")
		eventually(t, 20*time.Second, "a timed scrub to start", func() bool {
			return strings.Contains(s.stderr.String(), `msg="scrub started" trigger=timer`)
		})
		s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("serve did not stop during a scrub:\n%s", s.stderr.String())
		}
		if code := s.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(s.stderr.String(), `msg="scrub stopped early"`) {
			t.Fatalf("exit %d:\n%s", code, s.stderr.String())
		}
	})
}

// TestServeUpkeepFlagsBound: serve checks --sweep-every, --scrub-every and
// --scrub-rate as mount does, before it listens.
func TestServeUpkeepFlagsBound(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.fail(2, "at least 1s", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--sweep-every", "1ms")
	c.fail(2, "at least 1s", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--sweep-every", "-1s")
	c.fail(2, "at least 1s", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-every", "10ms")
	c.fail(2, "scrub-rate", "serve", "--listen", "127.0.0.1:0", "--insecure-loopback", "--scrub-rate", "-1")
}

// TestServeTokenKeepsUnlinkedBlob: docs/http.md promises that a pin token
// keeps its blob even once no namespace links it, through a sweep another
// process runs. A small HTTP put on the embedded SQLite store links in its
// own transaction; its pin, which the token holds, must still have a row
// for the other process's sweeps to see (store.ReleasesPinAtOnce is for
// callers that drop the pin at once, not for this one).
func TestServeTokenKeepsUnlinkedBlob(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.ok("ns", "create", "builds")
	s := startServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback")

	content := randomBytes(4096, 36)
	resp, err := http.Post(s.url+"/v1/blobs?namespace=builds", "application/octet-stream", bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	var put struct{ Token, Digest string }
	err = json.NewDecoder(resp.Body).Decode(&put)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 201 || put.Token == "" || put.Digest != sum(content) {
		t.Fatalf("put: %d %+v %v", resp.StatusCode, put, err)
	}
	// No namespace links it now: only the token keeps it.
	c.ok("unlink", "builds", put.Digest)
	// The durable window: the first sweep stages, the second deletes what
	// nothing protects.
	for i := range 2 {
		var rep struct {
			Deleted int
			Aborted string
		}
		if err := json.Unmarshal([]byte(c.ok("--gc-window", "0", "sweep", "--json")), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Aborted != "" {
			t.Fatalf("sweep %d aborted: %s", i+1, rep.Aborted)
		}
		if rep.Deleted != 0 {
			t.Fatalf("sweep %d in another process deleted %d blobs while a pin token held one", i+1, rep.Deleted)
		}
	}
	resp, err = http.Get(s.url + "/v1/blobs/" + put.Digest)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	got.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got.Bytes(), content) {
		t.Fatalf("a blob its live pin token keeps, after two sweeps by another process: GET %d (%d bytes)", resp.StatusCode, got.Len())
	}
	c.ok("stat", put.Digest)
	// Released, the token no longer keeps it: the next sweeps take it.
	if code := httpStatus(t, "DELETE", s.url+"/v1/pins/"+put.Token); code != 204 {
		t.Fatalf("release the pin: %d", code)
	}
}
