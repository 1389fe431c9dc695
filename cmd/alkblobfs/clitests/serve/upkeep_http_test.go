//go:build linux

package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestServeUpkeepOverHTTP: serve gives over HTTP what the mount's control
// files give — the last sweep and scrub reports, a sweep or scrub now, the
// sweep timer — to the callers who could use those files: root and the
// server's own user drive them (with the sweep verb); anyone the server
// accepts reads the reports, without names.
func TestServeUpkeepOverHTTP(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "s")
	src, _, large := clitest.WriteFile(t, t.TempDir(), 300<<10, 41) // a file of the large tier
	c.OK("put", "--ns", "s", src)
	loose, _, unlinked := clitest.WriteFile(t, t.TempDir(), 2000, 42)
	c.OK("put", loose) // linked by nothing: the sweeps collect it

	const (
		owner    = "upkeep-owner-token-0123456789"
		readOnly = "upkeep-read-only-token-012345"
		other    = "upkeep-other-user-token-01234"
		boundTok = "upkeep-bound-token-0123456789"
	)
	tokens := filepath.Join(t.TempDir(), "tokens")
	lines := owner + " root\n" + readOnly + " root verbs=read\n" + other + " nobody\n" + boundTok + " root namespaces=s\n"
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	s := clitest.StartServe(t, c, "--listen", "127.0.0.1:0", "--auth-token-file", tokens)

	do := func(method, path, token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	want := func(method, path, token, body string, status int) string {
		t.Helper()
		got, b := do(method, path, token, body)
		if got != status {
			t.Fatalf("%s %s %q with token %.14s… = %d %s; want %d", method, path, body, token, got, b, status)
		}
		return b
	}

	if b := want("GET", "/v1/upkeep/sweep", other, "", 200); strings.TrimSpace(b) != "{}" {
		t.Fatalf("the last sweep before any = %s; want {}", b)
	}
	// Driving is for root and the server's own user, with the sweep verb,
	// not bound to namespaces.
	for _, tok := range []string{other, readOnly, boundTok} {
		want("POST", "/v1/upkeep/sweep", tok, "", 403)
		want("POST", "/v1/upkeep/scrub", tok, "", 403)
		want("PUT", "/v1/upkeep/sweep-timer", tok, "1s", 403)
	}
	want("PUT", "/v1/upkeep/sweep-timer", owner, "every so often", 400)
	if b := want("GET", "/v1/upkeep/sweep-timer", other, "", 200); !strings.Contains(b, `"off"`) {
		t.Fatalf("the timer after a refused command = %s; want off", b)
	}

	// SQLite's window is durable: the first sweep queues, the second
	// deletes.
	var rep struct {
		Queued  int `json:"candidates_queued"`
		Deleted int `json:"deleted"`
	}
	for i, field := range []*int{&rep.Queued, &rep.Deleted} {
		b := want("POST", "/v1/upkeep/sweep", owner, "", 200)
		if err := json.Unmarshal([]byte(b), &rep); err != nil || *field != 1 {
			t.Fatalf("sweep %d over HTTP: %s (%v); want 1 queued, then 1 deleted", i+1, b, err)
		}
	}
	if got := want("GET", "/v1/blobs/"+unlinked, owner, "", 404); !strings.Contains(got, "not_found") {
		t.Fatalf("the swept blob: %s", got)
	}
	if b := want("GET", "/v1/upkeep/sweep", other, "", 200); !strings.Contains(b, `"deleted": 1`) && !strings.Contains(b, `"deleted":1`) {
		t.Fatalf("the last sweep's report read by another user = %s", b)
	}

	// A scrub over HTTP finds a flipped byte; from then on serve refuses
	// the blob, and only privileged callers see its digest in the report.
	f, err := os.OpenFile(filepath.Join(c.Data, "large", "blobs", large[:2], large), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'x'}, 1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b := want("POST", "/v1/upkeep/scrub", owner, "", 200); !strings.Contains(b, large) {
		t.Fatalf("the scrub's report does not name the corrupt blob: %s", b)
	}
	if b := want("GET", "/v1/upkeep/scrub", owner, "", 200); !strings.Contains(b, large) {
		t.Fatalf("the last scrub read by root does not name the corrupt blob: %s", b)
	}
	if b := want("GET", "/v1/upkeep/scrub", other, "", 200); strings.Contains(b, large) || !strings.Contains(b, `"corrupt"`) && !strings.Contains(b, "bad") {
		t.Fatalf("the last scrub read by another user: %s; want counts and no digest", b)
	}
	want("GET", "/v1/blobs/"+large+"?namespace=s", owner, "", 500)

	if b := want("PUT", "/v1/upkeep/sweep-timer", owner, "1s\n", 200); !strings.Contains(b, `"1s"`) {
		t.Fatalf("the timer after 1s = %s", b)
	}
}
