package ops_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/upkeep"
	"github.com/alkblobfs/alkblobfs/upkeep/upkeeptest"
)

// TestUpkeepGrammar runs the table every upkeep surface runs
// (upkeeptest) through PUT /v1/upkeep/sweep-timer: what the control file
// takes is 200 and sets the timer; what it refuses (EINVAL) is 400 with
// bad_request, and the timer is unchanged. Before, the body was trimmed
// of any white space, so " 1h" or "1h\r\n" was 200 here and EINVAL on the
// mount.
func TestUpkeepGrammar(t *testing.T) {
	e := newEnv(t, envOptions{})
	u, err := upkeep.New(upkeep.Config{Store: e.st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Stop)
	srv := ops.New(ops.Config{Store: e.st, Namespaces: e.svc, Upkeep: u, InsecureLoopback: true, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); srv.Close() })
	put := func(body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("PUT", hs.URL+"/v1/upkeep/sweep-timer", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	timer := func() string {
		t.Helper()
		resp, err := http.Get(hs.URL + "/v1/upkeep/sweep-timer")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct{ Timer string }
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v.Timer
	}
	for _, c := range upkeeptest.Cases {
		if code, b := put(upkeeptest.Before); code != 200 {
			t.Fatalf("PUT %s: %d %s", upkeeptest.Before, code, b)
		}
		code, b := put(c.Input)
		got := timer()
		switch {
		case c.Timer == "":
			if code != 400 || !strings.Contains(b, "bad_request") {
				t.Errorf("PUT %q: %d %s; want 400 bad_request", c.Input, code, strings.TrimSpace(b))
			}
			if got != upkeeptest.BeforeRead {
				t.Errorf("PUT %q: refused, but the timer is now %s", c.Input, got)
			}
		case code != 200 || got != c.Timer:
			t.Errorf("PUT %q: %d %s, timer %s; want 200 and %s", c.Input, code, strings.TrimSpace(b), got, c.Timer)
		}
	}
}
