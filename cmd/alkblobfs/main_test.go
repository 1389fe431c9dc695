package main

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

// The CLI is tested as a user runs it: TestMain builds the binary once and
// every test execs it against its own t.TempDir() store.
//
// Tests run in parallel (t.Parallel; make test gives -parallel 6): a
// command's or daemon's environment goes in cli.env or startDaemonEnv,
// never t.Setenv. A test stays serial, saying why, when it changes this
// process (GOGC), bounds a time, or holds files open on a mount whose every
// close counts: another test's fork and exec closes copies of them, and
// each close of a file in incoming/ is a FLUSH that commits.
var (
	bin      string
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "alkblobfs-cli-test-")
	if err != nil {
		buildErr = err
	} else {
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "alkblobfs")
		// Position-independent, as make build and make deb build it:
		// the tests that run make then find every package compiled.
		// With the upgrade's test hooks (upgrade_hooks.go), which a
		// production build does not have.
		if out, err := exec.Command("go", "build", "-buildmode=pie", "-tags", "alkblobfs_testhooks", "-o", bin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	m.Run() // a TestMain that returns exits with m.Run's status
}

// cli runs the binary with a private data directory and fixed global flags.
type cli struct {
	t     *testing.T
	data  string
	home  string // HOME of every run: never the real ~/.local/share
	flags []string
	// env is added to every run's environment: a test that runs its
	// commands with a variable sets it here, not with t.Setenv, so that it
	// may run in parallel with others.
	env []string
}

func newCLI(t *testing.T, flags ...string) *cli {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	data := t.TempDir()
	// A careful user's data directory: private (a readable one draws a
	// warning on stderr, which c.ok refuses).
	if err := os.Chmod(data, 0o700); err != nil {
		t.Fatal(err)
	}
	return &cli{t: t, data: data, home: t.TempDir(), flags: flags}
}

type result struct {
	stdout, stderr string
	code           int
	state          *os.ProcessState
}

// run executes alkblobfs --data <dir> <flags> args with stdin (nil: none).
func (c *cli) run(stdin io.Reader, args ...string) result {
	c.t.Helper()
	r, err := c.exec(stdin, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// exec is run without failing the test: for goroutines, which must not
// call t.Fatal. The error is a command that could not run at all.
func (c *cli) exec(stdin io.Reader, args ...string) (result, error) {
	cmd := exec.Command(bin, append(append([]string{"--data", c.data}, c.flags...), args...)...)
	cmd.Env = c.environ()
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		return result{}, fmt.Errorf("alkblobfs %s: %w", strings.Join(args, " "), err)
	}
	return result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode(), cmd.ProcessState}, nil
}

// environ is the environment of c's commands: the test's own, with HOME and
// c.env. (exec.Cmd keeps the last of duplicate variables.)
func (c *cli) environ() []string {
	return append(append(os.Environ(), "HOME="+c.home, "XDG_DATA_HOME="), c.env...)
}

// ok runs args, requires exit 0 and a quiet stderr, and returns stdout.
func (c *cli) ok(args ...string) string {
	c.t.Helper()
	r := c.run(nil, args...)
	if r.code != 0 || r.stderr != "" {
		c.t.Fatalf("alkblobfs %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// fail runs args and requires exit status code with exactly one stderr
// line "alkblobfs: …" containing want.
func (c *cli) fail(code int, want string, args ...string) result {
	c.t.Helper()
	r := c.run(nil, args...)
	checkFail(c.t, r, code, want, args)
	return r
}

func checkFail(t *testing.T, r result, code int, want string, args []string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("alkblobfs %s: exit %d, want %d (stderr %q)", strings.Join(args, " "), r.code, code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "alkblobfs: ") || !strings.Contains(lines[0], want) {
		t.Fatalf("alkblobfs %s: stderr %q, want one line \"alkblobfs: …%s…\"", strings.Join(args, " "), r.stderr, want)
	}
}

// lines splits output into its lines.
func lines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// writeFile writes n pseudo-random bytes (seeded, so reproducible) and
// returns the path and their digest.
func writeFile(t *testing.T, dir string, n int, seed uint64) (string, []byte, string) {
	t.Helper()
	b := randomBytes(n, seed)
	p := filepath.Join(dir, fmt.Sprintf("blob-%d-%d", n, seed))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b, sum(b)
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0xa1b))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
