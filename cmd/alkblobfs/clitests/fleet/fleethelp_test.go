//go:build linux

package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/enginetest/faultproxy"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
)

// Helpers for fleet tests whose hosts run with clocks of their own, on
// any large tier, each behind its own fault proxy.

// clockSkewEnv shifts the clock of an alkblobfs process (cmd/alkblobfs's
// skew.go). Named here again, not imported: it is part of the
// command's interface, which these black-box tests hold to.
const clockSkewEnv = "ALKBLOBFS_CLOCK_SKEW"

// skewHost is one fleet mount: its own data directory, mountpoint, proxy
// to PostgreSQL and clock skew (ALKBLOBFS_CLOCK_SKEW of its daemon). It
// can be killed and mounted again on the same mountpoint.
type skewHost struct {
	name  string
	skew  string // a Go duration, or "" for the wall clock
	proxy *faultproxy.Proxy
	data  string
	mnt   string
	flags []string
	dm    *clitest.Daemon
	past  string // the logs of its daemons before dm
	// seen counts the sweeps through the control file (sweep) whose
	// report showed they ran, and what they deleted: the host's log must
	// show at least those.
	seen sweepTally
}

// fleetFlags are the global flags of a fleet process on PostgreSQL dsn and
// the large tier large, with the short pin TTL of the partition tests
// (cutTTL). A host's go through its proxy p, with their short op timeout
// (cutOpWait); the CLI's (p nil) go straight, with the default one: a
// loaded machine may take longer than cutOpWait over the schema lock.
func fleetFlags(t *testing.T, dsn, large string, p *faultproxy.Proxy) []string {
	t.Helper()
	if p != nil {
		u, err := url.Parse(p.URL(t, dsn))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set(postgres.OpTimeoutParam, cutOpWait.String())
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	return []string{"--kv", dsn, "--large", large, "--fleet", "--pin-ttl", cutTTL.String()}
}

// startSkewHost mounts a new host. extra are mount flags (after the
// global ones).
func startSkewHost(t *testing.T, name, skew, dsn, large string, extra ...string) *skewHost {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	h := &skewHost{name: name, skew: skew, proxy: faultproxy.New(t, u.Host), data: t.TempDir(), mnt: t.TempDir()}
	h.flags = append(fleetFlags(t, dsn, large, h.proxy), extra...)
	h.mount(t)
	return h
}

// mount starts the host's daemon (again, after a kill: same data
// directory, same mountpoint) with its skew, in the daemon's environment
// alone.
func (h *skewHost) mount(t *testing.T) {
	t.Helper()
	if h.dm != nil {
		h.past += h.dm.Stderr.String()
	}
	h.dm = clitest.StartDaemonEnv(t, []string{clockSkewEnv + "=" + h.skew}, h.data, h.mnt, h.flags...)
}

// log is what every daemon of the host has logged.
func (h *skewHost) log() string { return h.past + h.dm.Stderr.String() }

// path is a path inside the host's mount.
func (h *skewHost) path(elem ...string) string {
	return filepath.Join(append([]string{h.mnt}, elem...)...)
}

// stats reads the host's /.alkblobfs/stats.
func (h *skewHost) stats(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(h.path(".alkblobfs", "stats"))
	if err != nil {
		t.Fatalf("stats of %s: %v", h.name, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// pinsLapsed is the host's count of pin rows found lapsed at renewal.
func (h *skewHost) pinsLapsed(t *testing.T) float64 {
	st, _ := h.stats(t)["store"].(map[string]any)
	n, _ := st["pins_lapsed"].(float64)
	return n
}

// sweep runs a sweep through the host's control file (bounded: the host
// must answer) and returns the control file's report, and whether that is
// this sweep's: a sweep aborted because another process held the lease
// leaves the previous report in place (gc: only a sweep that ran is
// recorded), so a report is fresh only if it started after the last one.
func (h *skewHost) sweep(t *testing.T) (rep map[string]any, fresh bool) {
	t.Helper()
	read := func() map[string]any {
		b, err := os.ReadFile(h.path(".alkblobfs", "sweep"))
		if err != nil {
			t.Fatalf("the sweep report of %s: %v", h.name, err)
		}
		var rep map[string]any
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatalf("sweep report of %s: %v\n%s", h.name, err, b)
		}
		return rep
	}
	var prev map[string]any
	// A hang detector, not a time bound: a sweep of thousands of
	// candidates under -race beside a CPU hog took over 30 s.
	within(t, 2*time.Minute, "a sweep through "+h.name+"'s control file", func() error {
		prev = read()
		if err := os.WriteFile(h.path(".alkblobfs", "sweep"), []byte("run\n"), 0o644); err != nil {
			return fmt.Errorf("sweep through %s: %w", h.name, err)
		}
		rep = read()
		return nil
	})
	fresh = rep["started"] != nil && rep["started"] != prev["started"] && rep["aborted"] == nil
	if fresh {
		h.seen.runs++
		if n, ok := rep["deleted"].(float64); ok {
			h.seen.deleted += int(n)
		}
	}
	return rep, fresh
}

// within runs op in a goroutine and fails the test if it errs or takes
// longer than d. A goroutine left blocked in a mount is freed when the
// daemons' cleanups abort their connections.
func within(t *testing.T, d time.Duration, what string, op func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %s", what, d)
	}
}

// heldFile is a blob held open on a host, its head read.
type heldFile struct {
	host   string
	digest string
	f      *os.File
	head   []byte
}

// hold opens blob d through h's namespace ns and reads its first 4 KiB.
func hold(t *testing.T, h *skewHost, ns, d string) *heldFile {
	t.Helper()
	f := clitest.OpenWithin(t, h.path(ns, d), 30*time.Second)
	t.Cleanup(func() { f.Close() })
	head := make([]byte, 4096)
	within(t, 10*time.Second, "reading the head of "+d[:12]+" on "+h.name, func() error {
		_, err := io.ReadFull(f, head)
		return err
	})
	return &heldFile{host: h.name, digest: d, f: f, head: head}
}

// readWhole reads the rest of the held file and closes it; the whole must
// hash to its name.
func (hf *heldFile) readWhole(t *testing.T) {
	t.Helper()
	within(t, 30*time.Second, "reading held "+hf.digest[:12]+" on "+hf.host+" to its end", func() error {
		rest, err := io.ReadAll(hf.f)
		if err != nil {
			return fmt.Errorf("a file held open on %s since before the faults: %w", hf.host, err)
		}
		if got := clitest.Sum(append(hf.head, rest...)); got != hf.digest {
			return fmt.Errorf("a file held open on %s read back as %s, want %s", hf.host, got, hf.digest)
		}
		return hf.f.Close()
	})
}

// loop is a shell loop run in its own process group until stopped.
type loop struct {
	name string
	cmd  *exec.Cmd
	stop string // the file whose existence ends the loop
	done chan struct{}
}

// startLoop runs script, which must end soon after $STOP exists.
func startLoop(t *testing.T, name, script string) *loop {
	t.Helper()
	l := &loop{name: name, stop: filepath.Join(t.TempDir(), "stop"), done: make(chan struct{})}
	l.cmd = exec.Command("sh", "-c", script)
	l.cmd.Env = append(os.Environ(), "STOP="+l.stop)
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		l.cmd.Wait()
		close(l.done)
	}()
	t.Cleanup(func() {
		syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
		<-l.done
	})
	return l
}

// end asks the loop to stop and waits for it, bounded; a loop that does
// not end (a command stuck in a mount) fails the test.
func (l *loop) end(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(l.stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the %s loop did not end within 30s of its stop file", l.name)
	}
}

var hexName = regexp.MustCompile(`^[0-9a-f]{64}$`)

// listed is the set of digests that dir (a namespace, through a mount)
// lists.
func listed(dir string) (map[string]bool, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range ents {
		if hexName.MatchString(e.Name()) {
			out[e.Name()] = true
		}
	}
	return out, nil
}

// sweepTally sums the "sweep done" log lines of a daemon's stderr
// (upkeep's Sweeper.Run: a timer's sweep, or one through the control
// file): how many sweeps ended, how many of them were aborted (the lease
// was elsewhere), and what they queued into the delete window and
// deleted. A sweep that failed logs "sweep failed" instead and is not
// counted.
type sweepTally struct{ runs, aborted, queued, deleted int }

// sweepField is one key=value of a log line in slog's text format: the
// value bare, or quoted with Go's escapes.
var sweepField = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S*)`)

func tallySweeps(log string) sweepTally {
	var s sweepTally
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `msg="sweep done"`) {
			continue
		}
		f := map[string]string{}
		for _, m := range sweepField.FindAllStringSubmatch(line, -1) {
			v := m[2]
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
			f[m[1]] = v
		}
		s.runs++
		if f["aborted"] != "" {
			s.aborted++
		}
		d, _ := strconv.Atoi(f["deleted"])
		q, _ := strconv.Atoi(f["queued"])
		s.deleted += d
		s.queued += q
	}
	return s
}

func (s sweepTally) String() string {
	return fmt.Sprintf("%d sweeps (%d aborted), %d queued, %d deleted", s.runs, s.aborted, s.queued, s.deleted)
}

// unlinkEINTR unlinks p with one system call at a time: a retried unlink
// whose first try committed before an interrupt fails with ENOENT, so an
// EINTR counts as done once p is gone.
func unlinkEINTR(p string) error {
	for {
		err := syscall.Unlink(p)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
		if _, serr := os.Stat(p); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
	}
}
