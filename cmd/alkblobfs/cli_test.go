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

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

func TestRoundTripDefault(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	clitest.RoundTrip(t, c, true)
	// The defaults put the engines under --data.
	for _, p := range []string{"kv.db", "large"} {
		if _, err := os.Stat(filepath.Join(c.Data, p)); err != nil {
			t.Errorf("default engines: %v", err)
		}
	}
}

func TestRoundTripMemKV(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t, "--kv", "mem:")
	clitest.RoundTrip(t, c, false)
}

func TestMemOnly(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t, "--kv", "mem:", "--large", "none")
	_, small, d := clitest.WriteFile(t, t.TempDir(), clitest.SmallSize, 3)
	r := c.Run(bytes.NewReader(small), "put", "-")
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != d {
		t.Fatalf("put - = %q exit %d (stderr %q), want %s", r.Stdout, r.Code, r.Stderr, d)
	}
	if entries, _ := os.ReadDir(c.Data); len(entries) != 0 {
		t.Errorf("mem-only store wrote to --data: %v", entries)
	}
}

// putStdin pipes content to put - : exec hands the child a pipe, so the
// size is unknown to the store.
func putStdin(t *testing.T, c *clitest.CLI, content []byte) string {
	t.Helper()
	r := c.Run(bytes.NewReader(content), "put", "-")
	if r.Code != 0 || r.Stderr != "" {
		t.Fatalf("put -: exit %d, stderr %q", r.Code, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

func TestPutStdinUnknownSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		flags []string
		size  int
		tier  string
	}{
		{"small", nil, clitest.SmallSize, "kv"},
		{"at threshold", nil, 128 << 10, "kv"},
		{"over threshold", nil, clitest.LargeSize, "large"},
		{"over a 4KiB threshold", []string{"--threshold", "4KiB"}, 10 << 10, "large"},
		{"empty", nil, 0, "kv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clitest.NewCLI(t, tc.flags...)
			content := clitest.RandomBytes(tc.size, 4)
			d := putStdin(t, c, content)
			if d != clitest.Sum(content) {
				t.Fatalf("put - printed %q, want %s", d, clitest.Sum(content))
			}
			if s := c.Stat(d); s.Tier != tc.tier || s.Size != int64(tc.size) {
				t.Errorf("stat = %+v, want tier %s size %d", s, tc.tier, tc.size)
			}
			if got := c.OK("cat", d); got != string(content) {
				t.Errorf("cat: wrong content")
			}
		})
	}
}

func TestPutStdinRedirectedFile(t *testing.T) {
	t.Parallel()
	// stdin that is a regular file has a known size.
	c := clitest.NewCLI(t)
	p, content, d := clitest.WriteFile(t, t.TempDir(), clitest.LargeSize, 5)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := c.Run(f, "put", "-")
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != d {
		t.Fatalf("put - < file: %q exit %d stderr %q", r.Stdout, r.Code, r.Stderr)
	}
	if got := c.OK("cat", d); got != string(content) {
		t.Errorf("cat: wrong content")
	}
}

func TestPutStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	p, _, d := clitest.WriteFile(t, t.TempDir(), clitest.SmallSize, 6)
	r := c.Run(nil, "put", p, filepath.Join(c.Data, "no-such-file"), p)
	clitest.CheckFail(t, r, 1, "no-such-file", []string{"put"})
	if got := clitest.Lines(r.Stdout); !slices.Equal(got, []string{d}) {
		t.Errorf("stdout = %q, want the first digest only", got)
	}
}

func TestKVOnlyRejectsLarge(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t, "--large", "none")
	p, content, _ := clitest.WriteFile(t, t.TempDir(), clitest.LargeSize, 7)
	c.Fail(1, "too large", "put", p)
	r := c.Run(bytes.NewReader(content), "put", "-")
	clitest.CheckFail(t, r, 1, "too large", []string{"put", "-"})
	if got := c.OK("ls"); got != "" {
		t.Fatalf("a rejected put stored something: ls = %q", got)
	}
	if _, err := os.Stat(filepath.Join(c.Data, "large")); !os.IsNotExist(err) {
		t.Errorf("kv-only store created a large tier: %v", err)
	}
	// Below the threshold it works.
	_, small, d := clitest.WriteFile(t, t.TempDir(), clitest.SmallSize, 8)
	if got := putStdin(t, c, small); got != d {
		t.Fatalf("put - = %q, want %s", got, d)
	}
}

func TestCorruptLargeBlob(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	dir := t.TempDir()
	p, content, d := clitest.WriteFile(t, dir, clitest.LargeSize, 9)
	c.OK("put", p)

	blobPath := filepath.Join(c.Data, "large", "blobs", d[:2], d)
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
	c.Fail(1, "does not match", "get", d, "-o", out)
	if entries, _ := os.ReadDir(outDir); len(entries) != 0 {
		t.Fatalf("failed get -o left %v", entries)
	}
	// An existing output file is left as it was.
	if err := os.WriteFile(out, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Fail(1, "does not match", "get", d, "-o", out)
	if got, _ := os.ReadFile(out); string(got) != "old" {
		t.Fatalf("failed get -o replaced the existing file: %q", got)
	}
	if entries, _ := os.ReadDir(outDir); len(entries) != 1 {
		t.Fatalf("failed get -o left %v", entries)
	}
	c.Fail(1, "does not match", "cat", d)
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
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
			c.Fail(tc.code, tc.want, tc.args...)
		})
	}
	// Bare alkblobfs prints a short usage and exits 0.
	r := c.Run(nil)
	if r.Code != 0 || r.Stderr != "" || !strings.Contains(r.Stdout, "Usage: alkblobfs [flags] COMMAND") ||
		!strings.Contains(r.Stdout, "mount") || strings.Count(r.Stdout, "\n") > 12 {
		t.Errorf("bare alkblobfs: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
}

func TestHelpEveryCommand(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	for _, cmd := range []string{"", "put", "get", "cat", "stat", "ls", "rm", "sweep", "verify",
		"ns", "ns create", "ns rm", "ns ls", "link", "unlink", "mount", "umount", "upgrade", "version", "completion", "completion bash", "completion zsh", "completion fish", "completion powershell"} {
		t.Run("help "+cmd, func(t *testing.T) {
			args := append(strings.Fields(cmd), "--help")
			out := c.OK(args...)
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
			c := clitest.NewCLI(t, flags...)
			p, _, d := clitest.WriteFile(t, t.TempDir(), clitest.LargeSize, 10)
			c.OK("put", p)
			if out := c.OK("sweep"); !strings.Contains(out, "sweep aborted: NoLivenessSources") {
				t.Errorf("sweep printed %q", out)
			}
			var rep map[string]any
			if err := json.Unmarshal([]byte(c.OK("sweep", "--json")), &rep); err != nil {
				t.Fatal(err)
			}
			if rep["aborted"] != "NoLivenessSources" || rep["deleted"] != float64(0) {
				t.Errorf("sweep --json = %v", rep)
			}
			if got := clitest.Lines(c.OK("ls")); !slices.Equal(got, []string{d}) {
				t.Errorf("an aborted sweep changed the store: ls = %q", got)
			}
			// Namespace commands say why they cannot work here.
			c.Fail(2, "this store keeps no namespaces", "ns", "create", "builds")
			c.Fail(2, "this store keeps no namespaces", "put", "--ns", "builds", p)
			c.Fail(2, "use --kv sqlite:PATH", "ls", "builds")
		})
	}
}

// TestPrivateStore: the store's files are private (kv.db 0600, large/
// 0700) even in a data directory other users can read, which draws a
// warning.
func TestPrivateStore(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	if err := os.Chmod(c.Data, 0o755); err != nil {
		t.Fatal(err)
	}
	r := c.Run(nil, "ls")
	if r.Code != 0 || !strings.Contains(r.Stderr, "open to other users") {
		t.Fatalf("ls in a 0755 data directory: exit %d, stderr %q; want a warning", r.Code, r.Stderr)
	}
	for p, want := range map[string]os.FileMode{"kv.db": 0o600, "large": 0o700} {
		fi, err := os.Stat(filepath.Join(c.Data, p))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v); want %#o", p, fi.Mode().Perm(), err, want)
		}
	}
	if err := os.Chmod(c.Data, 0o700); err != nil {
		t.Fatal(err)
	}
	c.OK("ls") // no warning
}

// TestSweepEveryBound: --sweep-every takes 0 (off) or at least a second.
func TestSweepEveryBound(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.Fail(2, "at least 1s", "mount", "--sweep-every", "1ms", t.TempDir())
	c.Fail(2, "at least 1s", "mount", "--sweep-every", "-1s", t.TempDir())
}

// TestScrubFlagsBound: --scrub-every takes 0 (off) or at least a second,
// --scrub-rate no negative number.
func TestScrubFlagsBound(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.Fail(2, "at least 1s", "mount", "--scrub-every", "10ms", t.TempDir())
	c.Fail(2, "scrub-rate", "mount", "--scrub-rate", "-1", t.TempDir())
}

// TestVersionAndCompletion: --version and version print the version and
// the Go version; completion writes a shell's completion script.
func TestVersionAndCompletion(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out := c.OK(args...)
		if !strings.HasPrefix(out, "alkblobfs ") || !strings.Contains(out, " go1.") {
			t.Errorf("alkblobfs %s = %q", args[0], out)
		}
	}
	if out := c.OK("completion", "bash"); !strings.Contains(out, "bash completion") {
		t.Errorf("completion bash wrote %.80q", out)
	}
}

// TestFlagsFromEnvironment: every global flag has an ALKBLOBFS_* variable;
// the flag wins over it, and a bad value is a usage error naming it.
func TestFlagsFromEnvironment(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.Env = []string{"ALKBLOBFS_KV=mem:", "ALKBLOBFS_LARGE=none", "ALKBLOBFS_THRESHOLD=10"}
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, make([]byte, 11), 0o644); err != nil {
		t.Fatal(err)
	}
	// mem: kv alone, 10-byte limit: the 11-byte file is too large.
	c.Fail(1, "too large", "put", src)
	// The flag wins over the variable.
	c.OK("--threshold", "1KiB", "put", src)
	c.Env = append(c.Env, "ALKBLOBFS_GC_WINDOW=soon")
	c.Fail(2, "ALKBLOBFS_GC_WINDOW", "ls")
}

// TestErrorWords: the errors users meet most, each asserted on its exact
// line and exit status.
func TestErrorWords(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	exact := func(code int, want string, args ...string) {
		t.Helper()
		r := c.Run(nil, args...)
		if r.Code != code || r.Stderr != "alkblobfs: "+want+"\n" {
			t.Errorf("alkblobfs %s: exit %d, stderr %q; want exit %d, %q", strings.Join(args, " "), r.Code, r.Stderr, code, "alkblobfs: "+want+"\n")
		}
	}
	exact(1, `namespace "nope" does not exist (create it with 'alkblobfs ns create nope')`, "ls", "nope")
	c.OK("ns", "create", "a", "b")
	d := putStdin(t, c, []byte("in two namespaces"))
	c.OK("link", "a", d)
	c.OK("link", "b", d)
	exact(1, fmt.Sprintf("delete %[1]s: refused: blob is protected by liveness: linked in namespace a, b; unlink it first: alkblobfs unlink a %[1]s && alkblobfs unlink b %[1]s", d), "rm", d)

	if os.Geteuid() != 0 {
		t.Skip("the unwritable data directory case needs another user (root makes one)")
	}
	u := fusetest.NewUser(t)
	fusetest.Reachable(t, clitest.Bin)
	fusetest.Reachable(t, c.Data)
	os.Chmod(c.Data, 0o700)
	out, err := u.Sh(fmt.Sprintf("HOME=/nonexistent %s --data %s ls", clitest.Bin, c.Data))
	if want := fmt.Sprintf("alkblobfs: data directory %s (set by --data): permission denied\n", c.Data); err == nil || !strings.HasSuffix(out, want) {
		t.Errorf("ls of another user's data directory: %v %q; want %q", err, out, want)
	}
}

// TestBackupRestoreMove follows docs/operations.md: a stopped store's data
// directory copied with cp -a is a complete backup; restored (here to
// another path, which is also how a store moves) it verifies and serves
// every blob and namespace.
func TestBackupRestoreMove(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "keep")
	dir := t.TempDir()
	small, _, ds := clitest.WriteFile(t, dir, 1000, 11)
	large, content, dl := clitest.WriteFile(t, dir, 3<<20, 12)
	c.OK("put", "--ns", "keep", small, large)

	backup := filepath.Join(t.TempDir(), "backup")
	if out, err := exec.Command("cp", "-a", c.Data, backup).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	if err := os.RemoveAll(c.Data); err != nil {
		t.Fatal(err)
	}
	moved := clitest.NewCLI(t)
	moved.Data = filepath.Join(t.TempDir(), "elsewhere")
	if out, err := exec.Command("cp", "-a", backup, moved.Data).CombinedOutput(); err != nil {
		t.Fatalf("restore: %v: %s", err, out)
	}
	moved.OK("verify")
	if got := clitest.Lines(moved.OK("ls", "keep")); !slices.Contains(got, ds) || !slices.Contains(got, dl) {
		t.Fatalf("restored namespace lists %v", got)
	}
	out := filepath.Join(t.TempDir(), "out")
	moved.OK("get", dl, "-o", out)
	if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("restored blob: %v", err)
	}
}
