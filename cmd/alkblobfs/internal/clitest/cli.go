package clitest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// CLI runs the binary with a private data directory and fixed global flags.
type CLI struct {
	T     *testing.T
	Data  string
	Home  string // HOME of every run: never the real ~/.local/share
	Flags []string
	// Env is added to every run's environment: a test that runs its
	// commands with a variable sets it here, not with t.Setenv, so that it
	// may run in parallel with others.
	Env []string
}

// NewCLI is a CLI on a new private data directory, running with flags;
// it fails the test if Main could not build the binary.
func NewCLI(t *testing.T, flags ...string) *CLI {
	t.Helper()
	if BuildErr != nil {
		t.Fatal(BuildErr)
	}
	data := t.TempDir()
	// A careful user's data directory: private (a readable one draws a
	// warning on stderr, which c.OK refuses).
	if err := os.Chmod(data, 0o700); err != nil {
		t.Fatal(err)
	}
	return &CLI{T: t, Data: data, Home: t.TempDir(), Flags: flags}
}

// Result is what a command left: its output, exit code and state.
type Result struct {
	Stdout, Stderr string
	Code           int
	State          *os.ProcessState
}

// Run executes alkblobfs --data <dir> <flags> args with stdin (nil: none).
func (c *CLI) Run(stdin io.Reader, args ...string) Result {
	c.T.Helper()
	r, err := c.Exec(stdin, args...)
	if err != nil {
		c.T.Fatal(err)
	}
	return r
}

// Exec is run without failing the test: for goroutines, which must not
// call t.Fatal. The error is a command that could not run at all.
func (c *CLI) Exec(stdin io.Reader, args ...string) (Result, error) {
	cmd := exec.Command(Bin, append(append([]string{"--data", c.Data}, c.Flags...), args...)...)
	cmd.Env = c.Environ()
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		return Result{}, fmt.Errorf("alkblobfs %s: %w", strings.Join(args, " "), err)
	}
	return ResultOf(stdout.String(), stderr.String(), cmd.ProcessState), nil
}

// ResultOf is the Result of a command that ran to its end with state.
func ResultOf(stdout, stderr string, state *os.ProcessState) Result {
	return Result{Stdout: stdout, Stderr: stderr, Code: state.ExitCode(), State: state}
}

// Environ is the environment of c's commands: the test's own, with HOME and
// c.Env. (exec.Cmd keeps the last of duplicate variables.)
func (c *CLI) Environ() []string {
	return append(append(os.Environ(), "HOME="+c.Home, "XDG_DATA_HOME="), c.Env...)
}

// OK runs args, requires exit 0 and a quiet stderr, and returns stdout.
func (c *CLI) OK(args ...string) string {
	c.T.Helper()
	r := c.Run(nil, args...)
	if r.Code != 0 || r.Stderr != "" {
		c.T.Fatalf("alkblobfs %s: exit %d, stderr %q", strings.Join(args, " "), r.Code, r.Stderr)
	}
	return r.Stdout
}

// Fail runs args and requires exit status code with exactly one stderr
// line "alkblobfs: …" containing want.
func (c *CLI) Fail(code int, want string, args ...string) Result {
	c.T.Helper()
	r := c.Run(nil, args...)
	CheckFail(c.T, r, code, want, args)
	return r
}

// CheckFail requires that r exited with code and wrote exactly one stderr
// line "alkblobfs: …" containing want: every refusal is one such line.
func CheckFail(t *testing.T, r Result, code int, want string, args []string) {
	t.Helper()
	if r.Code != code {
		t.Fatalf("alkblobfs %s: exit %d, want %d (stderr %q)", strings.Join(args, " "), r.Code, code, r.Stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "alkblobfs: ") || !strings.Contains(lines[0], want) {
		t.Fatalf("alkblobfs %s: stderr %q, want one line \"alkblobfs: …%s…\"", strings.Join(args, " "), r.Stderr, want)
	}
}

// Lines splits output into its lines.
func Lines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// WriteFile writes n pseudo-random bytes (seeded, so reproducible) and
// returns the path and their digest.
func WriteFile(t *testing.T, dir string, n int, seed uint64) (string, []byte, string) {
	t.Helper()
	b := RandomBytes(n, seed)
	p := filepath.Join(dir, fmt.Sprintf("blob-%d-%d", n, seed))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b, Sum(b)
}

// RandomBytes is n pseudo-random bytes, the same for the same seed.
func RandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0xa1b))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Sum is b's digest as alkblobfs names blobs: hex SHA-256.
func Sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Blob sizes that land in each tier at the default thresholds.
const (
	SmallSize = 1000      // kv tier at the default 128 KiB threshold
	LargeSize = 300 << 10 // large tier
)

// StatJSON is what alkblobfs stat --json prints.
type StatJSON struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	Tier   string `json:"tier"`
}

// Stat runs alkblobfs stat --json d.
func (c *CLI) Stat(d string) StatJSON {
	c.T.Helper()
	var s StatJSON
	if err := json.Unmarshal([]byte(c.OK("stat", "--json", d)), &s); err != nil {
		c.T.Fatal(err)
	}
	return s
}

// RoundTrip puts a small and a large blob and reads them back every way.
// kvPersists is false for a mem: kv tier, which is gone once put exits.
func RoundTrip(t *testing.T, c *CLI, kvPersists bool) {
	dir := t.TempDir()
	smallPath, small, smallD := WriteFile(t, dir, SmallSize, 1)
	largePath, large, largeD := WriteFile(t, dir, LargeSize, 2)

	if got := Lines(c.OK("put", smallPath, largePath)); !slices.Equal(got, []string{smallD, largeD}) {
		t.Fatalf("put printed %q, want %q", got, []string{smallD, largeD})
	}
	// A re-put dedups and prints the same digest.
	if got := strings.TrimSpace(c.OK("put", largePath)); got != largeD {
		t.Fatalf("re-put printed %q, want %s", got, largeD)
	}

	want := map[string][]byte{largeD: large}
	if kvPersists {
		want[smallD] = small
	} else {
		c.Fail(1, "blob missing", "stat", smallD)
	}
	for d, content := range want {
		s := c.Stat(d)
		wantTier := "large"
		if len(content) == SmallSize {
			wantTier = "kv"
		}
		if s.Digest != d || s.Size != int64(len(content)) || s.Tier != wantTier {
			t.Errorf("stat %s = %+v, want size %d tier %s", d, s, len(content), wantTier)
		}
		human := c.OK("stat", d)
		if !strings.Contains(human, "tier    "+wantTier) {
			t.Errorf("stat %s printed %q", d, human)
		}
		if got := c.OK("cat", d); got != string(content) {
			t.Errorf("cat %s: %d bytes differ from the %d put", d, len(got), len(content))
		}
		if got := c.OK("get", d); got != string(content) {
			t.Errorf("get %s to stdout: wrong content", d)
		}
		out := filepath.Join(dir, "out-"+d[:8])
		if got := c.OK("get", d, "-o", out); got != "" {
			t.Errorf("get -o printed %q on stdout", got)
		}
		if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, content) {
			t.Errorf("get -o %s: wrong content (err %v)", d, err)
		}
	}

	listed := Lines(c.OK("ls"))
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
	if got := c.OK("ls", "-l"); !strings.Contains(got, largeD+" 307200\n") {
		t.Errorf("ls -l = %q", got)
	}

	rm := []string{"rm"}
	if !kvPersists {
		// No namespaces, so nothing can prove the blob unreferenced: rm
		// refuses unless forced.
		c.Fail(1, "no liveness source", "rm", largeD)
		rm = append(rm, "--force")
	}
	c.OK(append(rm, largeD)...)
	c.Fail(1, "blob missing", append(rm, largeD)...)
	c.Fail(1, "blob missing", "get", largeD, "-o", filepath.Join(dir, "gone"))
	if _, err := os.Stat(filepath.Join(dir, "gone")); !os.IsNotExist(err) {
		t.Errorf("get -o of a missing blob left a file: %v", err)
	}
	if kvPersists {
		if got := Lines(c.OK("ls")); !slices.Equal(got, []string{smallD}) {
			t.Fatalf("ls after rm = %q, want [%s]", got, smallD)
		}
	}
}

// SweepJSON runs one sweep (alkblobfs sweep --json) and returns its report.
func (c *CLI) SweepJSON() map[string]any {
	c.T.Helper()
	var rep map[string]any
	if err := json.Unmarshal([]byte(c.OK("sweep", "--json")), &rep); err != nil {
		c.T.Fatal(err)
	}
	if rep["aborted"] != nil {
		c.T.Fatalf("sweep aborted: %v", rep)
	}
	return rep
}
