//go:build linux

package serve

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/ops"
)

// What serve learns while it runs: a chmod made by another process, and
// a token removed from its token file.

// status sends a GET of url with bearer token tok and returns the status.
func status(t *testing.T, url, tok string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// writeTokens replaces the token file at path with lines, mode 0600, as
// docs/http.md says to: a new file renamed over it, which a reread never
// sees half written.
func writeTokens(t *testing.T, path string, lines ...string) {
	t.Helper()
	writeTokensMode(t, path, 0o600, lines...)
}

func writeTokensMode(t *testing.T, path string, mode os.FileMode, lines ...string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestServeChmodRevokes: serve and a mount over one store, two processes;
// chmod (a third) closes a namespace through the mount to a token's user,
// and serve refuses that user's next request within the bound
// docs/http.md states, and chown, giving it the namespace, lets it in
// again. On SQLite, which has no change feed, every request that starts
// PermTTL (250 ms) after the command returned gets the new answer. On
// PostgreSQL, with the cache made an hour long, the feed's notification
// drops the entry: within 5 s here (milliseconds, measured).
func TestServeChmodRevokes(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	t.Run("sqlite", func(t *testing.T) { chmodRevokes(t, nil) })
	t.Run("postgres", func(t *testing.T) { chmodRevokes(t, []string{"--kv", pgtest.DSN(t)}) })
}

func chmodRevokes(t *testing.T, flags []string) {
	c := clitest.NewCLI(t, flags...)
	mnt := t.TempDir()
	clitest.StartDaemon(t, c.Data, mnt, flags...)
	ns := filepath.Join(mnt, "a")
	if err := os.Mkdir(ns, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ns, "incoming", "f"), []byte("for uid 4321"), 0o644); err != nil {
		t.Fatal(err)
	}
	// run runs a command (chmod, chown) on the namespace's directory and
	// returns when it returned.
	run := func(cmd, arg string) time.Time {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, cmd, arg, ns).CombinedOutput(); err != nil {
			t.Fatalf("%s %s %s: %v %s", cmd, arg, ns, err, out)
		}
		return time.Now()
	}
	chmod := func(mode string) time.Time { t.Helper(); return run("chmod", mode) }
	chown := func(owner string) time.Time { t.Helper(); return run("chown", owner) }
	chmod("755")

	const tok = "other-user-token-4321"
	file := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, file, tok+" 4321")
	args := []string{"--listen", "127.0.0.1:0", "--auth-token-file", file}
	feed := flags != nil
	if feed {
		args = append(args, "--perm-cache", "1h") // only the feed can tell it
	}
	s := clitest.StartServe(t, c, args...)
	url := s.URL + "/v1/blobs/" + hexSum("for uid 4321") + "?namespace=a"
	if got := status(t, url, tok); got != http.StatusOK {
		t.Fatalf("uid 4321's GET from a 0755 namespace: %d", got)
	}

	done := chmod("700")
	if feed {
		clitest.Eventually(t, 5*time.Second, "serve to refuse uid 4321 after chmod 700 (the cache lasts an hour: only the change feed drops it)", func() bool {
			return status(t, url, tok) == http.StatusForbidden
		})
		t.Logf("PostgreSQL: refused %s after chmod 700 returned", time.Since(done).Round(time.Millisecond))
		done = chown("4321")
		clitest.Eventually(t, 5*time.Second, "serve to let uid 4321 in after chown 4321", func() bool {
			return status(t, url, tok) == http.StatusOK
		})
		t.Logf("PostgreSQL: let in %s after chown 4321 returned", time.Since(done).Round(time.Millisecond))
		return
	}
	// No feed: the bound is the cache's life. Requests that start before
	// it may still get the old answer; none after.
	enforced := func(what string, done time.Time, want int) {
		t.Helper()
		bound := done.Add(ops.DefaultPermTTL)
		for seen := 0; seen < 3; {
			start := time.Now()
			got := status(t, url, tok)
			switch {
			case start.After(bound) && got != want:
				t.Fatalf("a GET started %s after %s returned answered %d, want %d; PermTTL is %s", start.Sub(done), what, got, want, ops.DefaultPermTTL)
			case start.After(bound):
				seen++
			case start.Sub(done) > 10*time.Second:
				t.Fatal("the bound never passed") // a clock that stands still
			}
		}
	}
	enforced("chmod 700", done, http.StatusForbidden)
	enforced("chown 4321", chown("4321"), http.StatusOK)
}

// TestServeTokenFileReload: serve follows its token file. A token removed
// from it is refused within TokenCheckEvery (1 s; 3 s allowed here, for a
// loaded machine); a file that fails to parse, or that others may read,
// keeps the tokens read before and says so in the log, and the chmod 600
// that fixes it is seen; a file with no tokens left refuses every token;
// SIGHUP rereads it at once.
func TestServeTokenFileReload(t *testing.T) {
	// Not parallel: it times the server's reread against its timer.
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	const alice, bob = "alice-token-0123456789", "bob-token-0123456789ab"
	file := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, file, alice+" 0", bob+" 0")
	s := clitest.StartServe(t, c, "--listen", "127.0.0.1:0", "--auth-token-file", file)
	metrics := s.URL + "/metrics"
	for _, tok := range []string{alice, bob} {
		if got := status(t, metrics, tok); got != http.StatusOK {
			t.Fatalf("a token of the file at start: %d", got)
		}
	}
	if ops.TokenCheckEvery != time.Second {
		t.Fatalf("TokenCheckEvery is %s; docs/http.md says every second", ops.TokenCheckEvery)
	}
	const bound = ops.TokenCheckEvery + 2*time.Second
	within := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		clitest.Eventually(t, 10*time.Second, what, cond)
		if el := time.Since(start); el > bound {
			t.Fatalf("%s took %s; the server checks its file every %s", what, el, ops.TokenCheckEvery)
		}
	}
	logged := func(what, line string) {
		t.Helper()
		clitest.Eventually(t, 10*time.Second, what, func() bool { return strings.Contains(s.Stderr.String(), line) })
	}

	// Revoked in place: alice's line gone.
	writeTokens(t, file, bob+" 0")
	within("alice's revoked token to be refused", func() bool { return status(t, metrics, alice) == http.StatusUnauthorized })
	if got := status(t, metrics, bob); got != http.StatusOK {
		t.Fatalf("bob's token, still in the file: %d", got)
	}
	logged("the reread in the log", `msg="reread the token file"`)

	// Broken: a line without its user. The old set stays.
	writeTokens(t, file, bob, alice+" 0")
	logged("the broken file in the log", "line 1: a token needs the user it acts as")
	if !strings.Contains(s.Stderr.String(), "still serving the tokens read before") {
		t.Fatalf("the log does not say the old tokens are kept:\n%s", s.Stderr.String())
	}
	if got, got2 := status(t, metrics, bob), status(t, metrics, alice); got != http.StatusOK || got2 != http.StatusUnauthorized {
		t.Fatalf("after a broken file: bob %d (want 200), alice %d (want 401): the old set is not what is served", got, got2)
	}

	// Readable by others: refused, old set kept; chmod 600 alone (only
	// the ctime changes) is seen and the file taken.
	writeTokensMode(t, file, 0o644, alice+" 0")
	logged("the loose file in the log", "lets other users read it")
	if got := status(t, metrics, bob); got != http.StatusOK {
		t.Fatalf("bob after a loose file: %d: the old set is not what is served", got)
	}
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	within("bob's token to be refused once the file is 0600", func() bool { return status(t, metrics, bob) == http.StatusUnauthorized })
	if got := status(t, metrics, alice); got != http.StatusOK {
		t.Fatalf("alice's token, back in the file: %d", got)
	}

	// Empty: every token refused.
	writeTokens(t, file, "# nobody")
	within("every token to be refused once the file holds none", func() bool { return status(t, metrics, alice) == http.StatusUnauthorized })
	logged("the empty file in the log", "it holds no tokens")

	// SIGHUP: reread at once (without a handler it would end serve).
	writeTokens(t, file, bob+" 0")
	if err := s.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	logged("the SIGHUP in the log", "SIGHUP: rereading the token file")
	within("bob's token to be taken after SIGHUP", func() bool { return status(t, metrics, bob) == http.StatusOK })
	select {
	case <-s.Done:
		t.Fatalf("serve exited on SIGHUP:\n%s", s.Stderr.String())
	default:
	}
	if strings.Contains(s.Stderr.String(), alice) || strings.Contains(s.Stderr.String(), bob) {
		t.Fatalf("a token is in serve's log:\n%s", s.Stderr.String())
	}
}

// TestMountListenReloadsOnHangup: mount --listen follows its token file
// as serve does, SIGHUP included, and SIGHUP leaves the mount mounted.
func TestMountListenReloadsOnHangup(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	const alice, bob = "alice-token-0123456789", "bob-token-0123456789ab"
	file := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, file, alice+" 0")
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, "--listen", "127.0.0.1:0", "--auth-token-file", file)
	metrics := dm.HTTPURL() + "/metrics"
	if got := status(t, metrics, bob); got != http.StatusUnauthorized {
		t.Fatalf("bob's token, not in the file yet: %d", got)
	}
	writeTokens(t, file, bob+" 0")
	if err := dm.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	clitest.Eventually(t, 10*time.Second, "the SIGHUP in the mount's log", func() bool {
		return strings.Contains(dm.Stderr.String(), "SIGHUP: rereading the token file")
	})
	clitest.Eventually(t, 10*time.Second, "bob's token to be taken after SIGHUP", func() bool { return status(t, metrics, bob) == http.StatusOK })
	if _, err := os.Stat(filepath.Join(mnt, ".alkblobfs", "stats")); err != nil {
		t.Fatalf("the mount after SIGHUP: %v\n%s", err, dm.Stderr.String())
	}
}
