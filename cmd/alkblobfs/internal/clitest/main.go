// Package clitest holds what alkblobfs's black-box tests share: they test
// the CLI as a user runs it. Main builds the binary once per test binary
// and every test execs it against its own t.TempDir() store, through CLI
// (commands), StartDaemon (mounts) and StartServe (HTTP servers).
//
// Tests run in parallel (t.Parallel; make test gives -parallel 6): a
// command's or daemon's environment goes in CLI.Env or StartDaemonEnv,
// never t.Setenv. A test stays serial, saying why, when it changes this
// process (GOGC), bounds a time, or holds files open on a mount whose every
// close counts: another test's fork and exec closes copies of them, and
// each close of a file in incoming/ is a FLUSH that commits. Each package
// of tests is its own process, so only its own tests can do that.
package clitest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Bin is the alkblobfs binary Main built; BuildErr is why there is none
// (NewCLI fails every test with it).
var (
	Bin      string
	BuildErr error
)

// Main is a test package's TestMain: it builds the binary into a temporary
// directory, runs the tests and removes the directory. A TestMain that
// returns exits with m.Run's status.
func Main(m *testing.M) {
	dir, err := os.MkdirTemp("", "alkblobfs-cli-test-")
	if err != nil {
		BuildErr = err
	} else {
		defer os.RemoveAll(dir)
		Bin = filepath.Join(dir, "alkblobfs")
		// Position-independent, as make build and make deb build it:
		// the tests that run make then find every package compiled.
		cmd := exec.Command("go", "build", "-buildmode=pie", "-o", Bin, pkgPath)
		if out, err := cmd.CombinedOutput(); err != nil {
			BuildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	m.Run()
}

// pkgPath is the command's package: go build finds it from any directory
// of the module, whichever package's tests run.
const pkgPath = "github.com/alkblobfs/alkblobfs/cmd/alkblobfs"

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

func NewCLI(t *testing.T, flags ...string) *CLI {
	t.Helper()
	if BuildErr != nil {
		t.Fatal(BuildErr)
	}
	data := t.TempDir()
	// A careful user's data directory: private (a readable one draws a
	// warning on stderr, which c.ok refuses).
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
// c.env. (exec.Cmd keeps the last of duplicate variables.)
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

func RandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0xa1b))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func Sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
