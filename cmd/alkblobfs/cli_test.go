package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

const (
	smallSize = 1000      // kv tier at the default 128 KiB threshold
	largeSize = 300 << 10 // large tier
)

type statJSON struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	Tier   string `json:"tier"`
}

func (c *cli) stat(d string) statJSON {
	c.t.Helper()
	var s statJSON
	if err := json.Unmarshal([]byte(c.ok("stat", "--json", d)), &s); err != nil {
		c.t.Fatal(err)
	}
	return s
}

// roundTrip puts a small and a large blob and reads them back every way.
// kvPersists is false for a mem: kv tier, which is gone once put exits.
func roundTrip(t *testing.T, c *cli, kvPersists bool) {
	dir := t.TempDir()
	smallPath, small, smallD := writeFile(t, dir, smallSize, 1)
	largePath, large, largeD := writeFile(t, dir, largeSize, 2)

	if got := lines(c.ok("put", smallPath, largePath)); !slices.Equal(got, []string{smallD, largeD}) {
		t.Fatalf("put printed %q, want %q", got, []string{smallD, largeD})
	}
	// A re-put dedups and prints the same digest.
	if got := strings.TrimSpace(c.ok("put", largePath)); got != largeD {
		t.Fatalf("re-put printed %q, want %s", got, largeD)
	}

	want := map[string][]byte{largeD: large}
	if kvPersists {
		want[smallD] = small
	} else {
		c.fail(1, "blob missing", "stat", smallD)
	}
	for d, content := range want {
		s := c.stat(d)
		wantTier := "large"
		if len(content) == smallSize {
			wantTier = "kv"
		}
		if s.Digest != d || s.Size != int64(len(content)) || s.Tier != wantTier {
			t.Errorf("stat %s = %+v, want size %d tier %s", d, s, len(content), wantTier)
		}
		human := c.ok("stat", d)
		if !strings.Contains(human, "tier    "+wantTier) {
			t.Errorf("stat %s printed %q", d, human)
		}
		if got := c.ok("cat", d); got != string(content) {
			t.Errorf("cat %s: %d bytes differ from the %d put", d, len(got), len(content))
		}
		if got := c.ok("get", d); got != string(content) {
			t.Errorf("get %s to stdout: wrong content", d)
		}
		out := filepath.Join(dir, "out-"+d[:8])
		if got := c.ok("get", d, "-o", out); got != "" {
			t.Errorf("get -o printed %q on stdout", got)
		}
		if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, content) {
			t.Errorf("get -o %s: wrong content (err %v)", d, err)
		}
	}

	listed := lines(c.ok("ls"))
	wantList := slices.Sorted(func(yield func(string) bool) {
		for d := range want {
			if !yield(d) {
				return
			}
		}
	})
	if !slices.Equal(listed, wantList) {
		t.Fatalf("ls = %q, want %q", listed, wantList)
	}
	if got := c.ok("ls", "-l"); !strings.Contains(got, largeD+" 307200\n") {
		t.Errorf("ls -l = %q", got)
	}

	rm := []string{"rm"}
	if !kvPersists {
		// No namespaces, so nothing can prove the blob unreferenced: rm
		// refuses unless forced.
		c.fail(1, "no liveness source", "rm", largeD)
		rm = append(rm, "--force")
	}
	c.ok(append(rm, largeD)...)
	c.fail(1, "blob missing", append(rm, largeD)...)
	c.fail(1, "blob missing", "get", largeD, "-o", filepath.Join(dir, "gone"))
	if _, err := os.Stat(filepath.Join(dir, "gone")); !os.IsNotExist(err) {
		t.Errorf("get -o of a missing blob left a file: %v", err)
	}
	if kvPersists {
		if got := lines(c.ok("ls")); !slices.Equal(got, []string{smallD}) {
			t.Fatalf("ls after rm = %q, want [%s]", got, smallD)
		}
	}
}

func TestRoundTripDefault(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	roundTrip(t, c, true)
	// The defaults put the engines under --data.
	for _, p := range []string{"kv.db", "large"} {
		if _, err := os.Stat(filepath.Join(c.data, p)); err != nil {
			t.Errorf("default engines: %v", err)
		}
	}
}

func TestRoundTripMemKV(t *testing.T) {
	t.Parallel()
	c := newCLI(t, "--kv", "mem:")
	roundTrip(t, c, false)
}

func TestMemOnly(t *testing.T) {
	t.Parallel()
	c := newCLI(t, "--kv", "mem:", "--large", "none")
	_, small, d := writeFile(t, t.TempDir(), smallSize, 3)
	r := c.run(bytes.NewReader(small), "put", "-")
	if r.code != 0 || strings.TrimSpace(r.stdout) != d {
		t.Fatalf("put - = %q exit %d (stderr %q), want %s", r.stdout, r.code, r.stderr, d)
	}
	if entries, _ := os.ReadDir(c.data); len(entries) != 0 {
		t.Errorf("mem-only store wrote to --data: %v", entries)
	}
}

// putStdin pipes content to put - : exec hands the child a pipe, so the
// size is unknown to the store.
func putStdin(t *testing.T, c *cli, content []byte) string {
	t.Helper()
	r := c.run(bytes.NewReader(content), "put", "-")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("put -: exit %d, stderr %q", r.code, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

func TestPutStdinUnknownSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		flags []string
		size  int
		tier  string
	}{
		{"small", nil, smallSize, "kv"},
		{"at threshold", nil, 128 << 10, "kv"},
		{"over threshold", nil, largeSize, "large"},
		{"over a 4KiB threshold", []string{"--threshold", "4KiB"}, 10 << 10, "large"},
		{"empty", nil, 0, "kv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCLI(t, tc.flags...)
			content := randomBytes(tc.size, 4)
			d := putStdin(t, c, content)
			if d != sum(content) {
				t.Fatalf("put - printed %q, want %s", d, sum(content))
			}
			if s := c.stat(d); s.Tier != tc.tier || s.Size != int64(tc.size) {
				t.Errorf("stat = %+v, want tier %s size %d", s, tc.tier, tc.size)
			}
			if got := c.ok("cat", d); got != string(content) {
				t.Errorf("cat: wrong content")
			}
		})
	}
}

func TestPutStdinRedirectedFile(t *testing.T) {
	t.Parallel()
	// stdin that is a regular file has a known size.
	c := newCLI(t)
	p, content, d := writeFile(t, t.TempDir(), largeSize, 5)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := c.run(f, "put", "-")
	if r.code != 0 || strings.TrimSpace(r.stdout) != d {
		t.Fatalf("put - < file: %q exit %d stderr %q", r.stdout, r.code, r.stderr)
	}
	if got := c.ok("cat", d); got != string(content) {
		t.Errorf("cat: wrong content")
	}
}

func TestPutStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	p, _, d := writeFile(t, t.TempDir(), smallSize, 6)
	r := c.run(nil, "put", p, filepath.Join(c.data, "no-such-file"), p)
	checkFail(t, r, 1, "no-such-file", []string{"put"})
	if got := lines(r.stdout); !slices.Equal(got, []string{d}) {
		t.Errorf("stdout = %q, want the first digest only", got)
	}
}

func TestKVOnlyRejectsLarge(t *testing.T) {
	t.Parallel()
	c := newCLI(t, "--large", "none")
	p, content, _ := writeFile(t, t.TempDir(), largeSize, 7)
	c.fail(1, "too large", "put", p)
	r := c.run(bytes.NewReader(content), "put", "-")
	checkFail(t, r, 1, "too large", []string{"put", "-"})
	if got := c.ok("ls"); got != "" {
		t.Fatalf("a rejected put stored something: ls = %q", got)
	}
	if _, err := os.Stat(filepath.Join(c.data, "large")); !os.IsNotExist(err) {
		t.Errorf("kv-only store created a large tier: %v", err)
	}
	// Below the threshold it works.
	_, small, d := writeFile(t, t.TempDir(), smallSize, 8)
	if got := putStdin(t, c, small); got != d {
		t.Fatalf("put - = %q, want %s", got, d)
	}
}

func TestCorruptLargeBlob(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	dir := t.TempDir()
	p, content, d := writeFile(t, dir, largeSize, 9)
	c.ok("put", p)

	blobPath := filepath.Join(c.data, "large", "blobs", d[:2], d)
	if _, err := os.Stat(blobPath); err != nil {
		t.Fatalf("large blob not where expected: %v", err)
	}
	if err := os.Chmod(blobPath, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(blobPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, content) {
		t.Fatal("stored file does not hold the blob's bytes")
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(blobPath, b, 0o644); err != nil {
		t.Fatal(err)
	}

	outDir := t.TempDir()
	out := filepath.Join(outDir, "out")
	c.fail(1, "does not match", "get", d, "-o", out)
	if entries, _ := os.ReadDir(outDir); len(entries) != 0 {
		t.Fatalf("failed get -o left %v", entries)
	}
	// An existing output file is left as it was.
	if err := os.WriteFile(out, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.fail(1, "does not match", "get", d, "-o", out)
	if got, _ := os.ReadFile(out); string(got) != "old" {
		t.Fatalf("failed get -o replaced the existing file: %q", got)
	}
	if entries, _ := os.ReadDir(outDir); len(entries) != 1 {
		t.Fatalf("failed get -o left %v", entries)
	}
	c.fail(1, "does not match", "cat", d)
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	absent := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"pt"}, 2, `did you mean "put"`},
		{[]string{"ls", "--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"get"}, 2, "want one DIGEST, got 0"},
		{[]string{"stat", absent, absent}, 2, "want one DIGEST, got 2"},
		{[]string{"put"}, 2, "at least one FILE"},
		{[]string{"put", "-", "-"}, 2, "standard input (-) given 2 times"},
		{[]string{"ls", "x", "y"}, 2, "want no arguments or one NAME, got 2"},
		{[]string{"get", "xyz"}, 2, "invalid digest"},
		{[]string{"cat", strings.Repeat("zz", 32)}, 2, "invalid digest"},
		{[]string{"stat", absent[:63]}, 2, "invalid digest"},
		{[]string{"rm", absent, "nothex"}, 2, "invalid digest"},
		{[]string{"--threshold", "12XB", "ls"}, 2, "unknown unit"},
		{[]string{"--threshold", "0", "ls"}, 2, "at least 1 byte"},
		{[]string{"--log-level", "loud", "ls"}, 2, "want debug, info, warn or error"},
		{[]string{"--kv", "bogus:x", "ls"}, 2, "unknown engine"},
		{[]string{"--kv", "local:/tmp/x", "ls"}, 2, "local is a large-tier engine"},
		{[]string{"--large", "sqlite:/tmp/x.db", "ls"}, 2, "sqlite is a kv-tier engine"},
		{[]string{"--kv", "postgres://localhost:notaport/blobs", "ls"}, 2, "invalid PostgreSQL DSN"},
		{[]string{"--large", "pglo", "ls"}, 2, "needs --kv postgres://"},
		{[]string{"--kv", "none", "--large", "none", "ls"}, 2, "at least one engine"},
		{[]string{"get", absent}, 1, absent + ": blob missing"},
		{[]string{"cat", absent}, 1, "blob missing"},
		{[]string{"stat", absent}, 1, "blob missing"},
		{[]string{"rm", absent}, 1, "blob missing"},
		{[]string{"put", "/no/such/file"}, 1, "no such file"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c.fail(tc.code, tc.want, tc.args...)
		})
	}
	// Bare alkblobfs prints a short usage and exits 0.
	r := c.run(nil)
	if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Usage: alkblobfs [flags] COMMAND") ||
		!strings.Contains(r.stdout, "mount") || strings.Count(r.stdout, "\n") > 12 {
		t.Errorf("bare alkblobfs: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestHelpEveryCommand(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, cmd := range []string{"", "put", "get", "cat", "stat", "ls", "rm", "sweep", "verify",
		"ns", "ns create", "ns rm", "ns ls", "link", "unlink", "mount", "umount", "upgrade", "version", "completion", "completion bash", "completion zsh", "completion fish", "completion powershell"} {
		t.Run("help "+cmd, func(t *testing.T) {
			args := append(strings.Fields(cmd), "--help")
			out := c.ok(args...)
			if !strings.Contains(out, "Examples:\n  alkblobfs ") || !strings.Contains(out, "Usage:") {
				t.Errorf("alkblobfs %s --help shows no example:\n%s", cmd, out)
			}
		})
	}
}

// A store that keeps no namespaces (no kv tier, or a mem: kv tier beside a
// durable large tier) registers no liveness source: its sweeps abort and
// delete nothing.
func TestSweepWithoutSourcesAborts(t *testing.T) {
	t.Parallel()
	for _, flags := range [][]string{{"--kv", "none"}, {"--kv", "mem:"}} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			c := newCLI(t, flags...)
			p, _, d := writeFile(t, t.TempDir(), largeSize, 10)
			c.ok("put", p)
			if out := c.ok("sweep"); !strings.Contains(out, "sweep aborted: NoLivenessSources") {
				t.Errorf("sweep printed %q", out)
			}
			var rep map[string]any
			if err := json.Unmarshal([]byte(c.ok("sweep", "--json")), &rep); err != nil {
				t.Fatal(err)
			}
			if rep["aborted"] != "NoLivenessSources" || rep["deleted"] != float64(0) {
				t.Errorf("sweep --json = %v", rep)
			}
			if got := lines(c.ok("ls")); !slices.Equal(got, []string{d}) {
				t.Errorf("an aborted sweep changed the store: ls = %q", got)
			}
			// Namespace commands say why they cannot work here.
			c.fail(2, "this store keeps no namespaces", "ns", "create", "builds")
			c.fail(2, "this store keeps no namespaces", "put", "--ns", "builds", p)
			c.fail(2, "use --kv sqlite:PATH", "ls", "builds")
		})
	}
}

// TestPrivateStore: the store's files are private (kv.db 0600, large/
// 0700) even in a data directory other users can read, which draws a
// warning.
func TestPrivateStore(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if err := os.Chmod(c.data, 0o755); err != nil {
		t.Fatal(err)
	}
	r := c.run(nil, "ls")
	if r.code != 0 || !strings.Contains(r.stderr, "open to other users") {
		t.Fatalf("ls in a 0755 data directory: exit %d, stderr %q; want a warning", r.code, r.stderr)
	}
	for p, want := range map[string]os.FileMode{"kv.db": 0o600, "large": 0o700} {
		fi, err := os.Stat(filepath.Join(c.data, p))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v); want %#o", p, fi.Mode().Perm(), err, want)
		}
	}
	if err := os.Chmod(c.data, 0o700); err != nil {
		t.Fatal(err)
	}
	c.ok("ls") // no warning
}

// TestSweepEveryBound: --sweep-every takes 0 (off) or at least a second.
func TestSweepEveryBound(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.fail(2, "at least 1s", "mount", "--sweep-every", "1ms", t.TempDir())
	c.fail(2, "at least 1s", "mount", "--sweep-every", "-1s", t.TempDir())
}

// TestScrubFlagsBound: --scrub-every takes 0 (off) or at least a second,
// --scrub-rate no negative number.
func TestScrubFlagsBound(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.fail(2, "at least 1s", "mount", "--scrub-every", "10ms", t.TempDir())
	c.fail(2, "scrub-rate", "mount", "--scrub-rate", "-1", t.TempDir())
}

// TestVersionAndCompletion: --version and version print the version and
// the Go version; completion writes a shell's completion script.
func TestVersionAndCompletion(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out := c.ok(args...)
		if !strings.HasPrefix(out, "alkblobfs ") || !strings.Contains(out, " go1.") {
			t.Errorf("alkblobfs %s = %q", args[0], out)
		}
	}
	if out := c.ok("completion", "bash"); !strings.Contains(out, "bash completion") {
		t.Errorf("completion bash wrote %.80q", out)
	}
}

// TestFlagsFromEnvironment: every global flag has an ALKBLOBFS_* variable;
// the flag wins over it, and a bad value is a usage error naming it.
func TestFlagsFromEnvironment(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.env = []string{"ALKBLOBFS_KV=mem:", "ALKBLOBFS_LARGE=none", "ALKBLOBFS_THRESHOLD=10"}
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, make([]byte, 11), 0o644); err != nil {
		t.Fatal(err)
	}
	// mem: kv alone, 10-byte limit: the 11-byte file is too large.
	c.fail(1, "too large", "put", src)
	// The flag wins over the variable.
	c.ok("--threshold", "1KiB", "put", src)
	c.env = append(c.env, "ALKBLOBFS_GC_WINDOW=soon")
	c.fail(2, "ALKBLOBFS_GC_WINDOW", "ls")
}

// TestErrorWords: the errors users meet most, each asserted on its exact
// line and exit status.
func TestErrorWords(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	exact := func(code int, want string, args ...string) {
		t.Helper()
		r := c.run(nil, args...)
		if r.code != code || r.stderr != "alkblobfs: "+want+"\n" {
			t.Errorf("alkblobfs %s: exit %d, stderr %q; want exit %d, %q", strings.Join(args, " "), r.code, r.stderr, code, "alkblobfs: "+want+"\n")
		}
	}
	exact(1, `namespace "nope" does not exist (create it with 'alkblobfs ns create nope')`, "ls", "nope")
	c.ok("ns", "create", "a", "b")
	d := putStdin(t, c, []byte("in two namespaces"))
	c.ok("link", "a", d)
	c.ok("link", "b", d)
	exact(1, fmt.Sprintf("delete %[1]s: refused: blob is protected by liveness: linked in namespace a, b; unlink it first: alkblobfs unlink a %[1]s && alkblobfs unlink b %[1]s", d), "rm", d)

	if os.Geteuid() != 0 {
		t.Skip("the unwritable data directory case needs another user (root makes one)")
	}
	u := fusetest.NewUser(t)
	fusetest.Reachable(t, bin)
	fusetest.Reachable(t, c.data)
	os.Chmod(c.data, 0o700)
	out, err := u.Sh(fmt.Sprintf("HOME=/nonexistent %s --data %s ls", bin, c.data))
	if want := fmt.Sprintf("alkblobfs: data directory %s (set by --data): permission denied\n", c.data); err == nil || !strings.HasSuffix(out, want) {
		t.Errorf("ls of another user's data directory: %v %q; want %q", err, out, want)
	}
}

// TestBackupRestoreMove follows docs/operations.md: a stopped store's data
// directory copied with cp -a is a complete backup; restored (here to
// another path, which is also how a store moves) it verifies and serves
// every blob and namespace.
func TestBackupRestoreMove(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.ok("ns", "create", "keep")
	dir := t.TempDir()
	small, _, ds := writeFile(t, dir, 1000, 11)
	large, content, dl := writeFile(t, dir, 3<<20, 12)
	c.ok("put", "--ns", "keep", small, large)

	backup := filepath.Join(t.TempDir(), "backup")
	if out, err := exec.Command("cp", "-a", c.data, backup).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	if err := os.RemoveAll(c.data); err != nil {
		t.Fatal(err)
	}
	moved := newCLI(t)
	moved.data = filepath.Join(t.TempDir(), "elsewhere")
	if out, err := exec.Command("cp", "-a", backup, moved.data).CombinedOutput(); err != nil {
		t.Fatalf("restore: %v: %s", err, out)
	}
	moved.ok("verify")
	if got := lines(moved.ok("ls", "keep")); !slices.Contains(got, ds) || !slices.Contains(got, dl) {
		t.Fatalf("restored namespace lists %v", got)
	}
	out := filepath.Join(t.TempDir(), "out")
	moved.ok("get", dl, "-o", out)
	if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("restored blob: %v", err)
	}
}
