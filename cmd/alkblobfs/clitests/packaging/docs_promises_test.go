//go:build linux

package packaging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// Sentences of docs/ that had no test, each checked as a user meets it.

// TestWrongDigestPutByPath: docs/errors.md and troubleshooting.md say a
// create under a digest name whose content does not hash to it fails at
// close() with EIO and publishes nothing: cp and Python report the EIO,
// while `echo hello > NS/<wrong digest>` exits 0 because the shell ignores
// close()'s error.
func TestWrongDigestPutByPath(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	mnt := t.TempDir()
	clitest.StartDaemon(t, c.Data, mnt)
	ns := filepath.Join(mnt, "builds")
	src := filepath.Join(t.TempDir(), "hello")
	if err := os.WriteFile(src, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	right := clitest.Sum([]byte("hello\n"))

	run := func(name string, args ...string) (string, int) {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		code := 0
		if err != nil {
			ee, ok := err.(*exec.ExitError)
			if !ok {
				t.Fatalf("%s: %v", name, err)
			}
			code = ee.ExitCode()
		}
		return string(out), code
	}

	wrong := filepath.Join(ns, clitest.Sum([]byte("something else")))
	if out, code := run("cp", src, wrong); code == 0 || !strings.Contains(out, "Input/output error") {
		t.Errorf("cp to a wrong digest name: exit %d, %q; want a failure naming Input/output error", code, out)
	}
	if py, err := exec.LookPath("python3"); err != nil {
		if os.Getenv("ALKBLOBFS_REQUIRE_FUSE") == "1" {
			t.Error("no python3 on PATH (make deps installs it): the Python half is not checked")
		} else {
			t.Log("no python3 on PATH: the Python half is not checked")
		}
	} else {
		script := `import errno, sys
try:
    with open(sys.argv[1], "wb") as f:
        f.write(b"hello\n")
except OSError as e:
    print(errno.errorcode[e.errno])
    sys.exit(3)
print("no error")`
		wrong := filepath.Join(ns, clitest.Sum([]byte("a third content")))
		if out, code := run(py, "-c", script, wrong); code != 3 || strings.TrimSpace(out) != "EIO" {
			t.Errorf("python3 writing to a wrong digest name: exit %d, %q; want OSError EIO", code, out)
		}
	}
	for _, sh := range []string{"sh", "bash"} {
		wrong := filepath.Join(ns, clitest.Sum([]byte(sh)))
		if out, code := run(sh, "-c", "echo hello > "+wrong); code != 0 {
			t.Errorf("%s -c 'echo hello > NS/<wrong digest>': exit %d, %q; the docs say it exits 0", sh, code, out)
		}
	}
	names := func() []string {
		ents, err := os.ReadDir(ns)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if got := names(); len(got) != 1 || got[0] != "incoming" {
		t.Fatalf("after the wrong-digest writes the namespace holds %q; want incoming alone", got)
	}
	// The right name is a put: the failures above were the check.
	if out, code := run("cp", src, filepath.Join(ns, right)); code != 0 {
		t.Fatalf("cp to the right digest name: exit %d, %s", code, out)
	}
	if got := names(); len(got) != 2 || got[0] != right {
		t.Fatalf("after cp to the right name the namespace holds %q; want %s and incoming", got, right)
	}
}

// TestMountDebugAndLogLevel: docs/troubleshooting.md and mount.md say
// `--log-level debug` adds the expected refusals (EPERM, ENOENT, …) to the
// log and `--debug` logs every FUSE request, at debug level.
func TestMountDebugAndLogLevel(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")

	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, c.Data, mnt, "--log-level", "debug")
	if err := os.Mkdir(filepath.Join(mnt, "builds", "dir"), 0o755); !os.IsPermission(err) {
		t.Fatalf("mkdir in a namespace: %v; want EPERM", err)
	}
	refusal := regexp.MustCompile(`level=DEBUG msg="request failed" op=\S+ errno="operation not permitted"`)
	clitest.Eventually(t, 10*time.Second, "the EPERM refusal in the --log-level debug log", func() bool {
		return refusal.MatchString(dm.Stderr.String())
	})
	if strings.Contains(dm.Stderr.String(), `msg="rx `) {
		t.Errorf("--log-level debug without --debug logs FUSE requests:\n%s", dm.Stderr.String())
	}
	clitest.StopDaemon(t, dm)

	dm = clitest.StartDaemon(t, c.Data, mnt, "--debug")
	if _, err := os.Stat(filepath.Join(mnt, "builds", "no-such-name")); !os.IsNotExist(err) {
		t.Fatalf("stat of an absent name: %v; want ENOENT", err)
	}
	request := regexp.MustCompile(`level=DEBUG msg="rx \d+: LOOKUP n\d+ +\\"no-such-name\\"`)
	clitest.Eventually(t, 10*time.Second, "the LOOKUP request in the --debug log", func() bool {
		return request.MatchString(dm.Stderr.String())
	})
	clitest.StopDaemon(t, dm)
}

// TestMountUploadMemory: --upload-memory bounds what the files being
// written into incoming/ keep in memory together; past it they spill to
// disk, into --scratch when the large tier cannot stage (here, none).
func TestMountUploadMemory(t *testing.T) {
	// Not parallel: its files open on the mount must see no close but its
	// own, and another test's fork and exec closes copies of them (a FLUSH each).
	clitest.RequireFUSE(t)
	scratch := t.TempDir()
	mnt := t.TempDir()
	dm := clitest.StartDaemon(t, t.TempDir(), mnt, "--large", "none", "--upload-memory", "64KiB", "--scratch", scratch)
	if err := os.Mkdir(filepath.Join(mnt, "builds"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Three files of 40 KiB, all open: 120 KiB against a 64 KiB bound.
	var files []*os.File
	var digests []string
	for i := range 3 {
		f, err := os.Create(filepath.Join(mnt, "builds", "incoming", fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		data := clitest.RandomBytes(40<<10, uint64(i+1))
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		files, digests = append(files, f), append(digests, clitest.Sum(data))
	}
	var stats struct {
		Store struct {
			UploadMemory int64 `json:"upload_memory_bytes"`
		} `json:"store"`
		UploadsInFlight int `json:"uploads_in_flight"`
	}
	b, err := os.ReadFile(filepath.Join(mnt, ".alkblobfs", "stats"))
	if err != nil || json.Unmarshal(b, &stats) != nil {
		t.Fatalf("stats: %v %s", err, b)
	}
	if stats.UploadsInFlight != 3 || stats.Store.UploadMemory > 64<<10 || stats.Store.UploadMemory == 0 {
		t.Fatalf("3 open uploads of 40 KiB keep %d bytes in memory (%d in flight); want at most --upload-memory 64KiB, and some",
			stats.Store.UploadMemory, stats.UploadsInFlight)
	}
	// The spilled ones are (nameless) scratch files the daemon holds.
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", dm.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	inScratch := 0
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, scratch+"/") {
			inScratch++
		}
	}
	if inScratch == 0 {
		t.Fatalf("the daemon holds no file in --scratch %s, with 120 KiB of uploads over a 64 KiB bound", scratch)
	}
	for i, f := range files {
		if err := f.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
		if _, err := os.Stat(filepath.Join(mnt, "builds", digests[i])); err != nil {
			t.Errorf("upload %d is not published: %v", i, err)
		}
	}
}

// TestTokenTTLFlag: `mount --listen … --token-ttl` and `serve --token-ttl`
// set the life of a put's pin token after the put or its last renewal
// (docs/mount.md, docs/http.md#pin-tokens): renewed at once it lives; left
// alone it lapses after the TTL, and a renewal then answers [false].
func TestTokenTTLFlag(t *testing.T) {
	t.Parallel()
	for _, surface := range []string{"mount", "serve"} {
		t.Run(surface, func(t *testing.T) {
			c := clitest.NewCLI(t)
			c.OK("ns", "create", "builds")
			var url string
			args := []string{"--token-ttl", "2s", "--insecure-loopback"}
			if surface == "mount" {
				clitest.RequireFUSE(t)
				d := clitest.StartDaemon(t, c.Data, t.TempDir(), append(args, "--listen", "127.0.0.1:0")...)
				url = d.HTTPURL()
			} else {
				url = clitest.StartServe(t, c, append(args, "--listen", "127.0.0.1:0")...).URL
			}
			resp, err := http.Post(url+"/v1/blobs?namespace=builds", "application/octet-stream", bytes.NewReader(clitest.RandomBytes(5000, 7)))
			if err != nil || resp.StatusCode != 201 {
				t.Fatalf("HTTP put: %v %v", resp, err)
			}
			var put struct{ Token, Digest string }
			err = json.NewDecoder(resp.Body).Decode(&put)
			resp.Body.Close()
			if err != nil || put.Token == "" {
				t.Fatalf("put answer: %+v %v", put, err)
			}
			renew := func() string {
				body := fmt.Sprintf(`{"namespace": "builds", "digests": [%q], "token": %q}`, put.Digest, put.Token)
				resp, err := http.Post(url+"/v1/blobs/have", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var b bytes.Buffer
				b.ReadFrom(resp.Body)
				return strings.Join(strings.Fields(b.String()), "")
			}
			if got := renew(); got != `{"present":[true]}` {
				t.Fatalf("renewal right after the put: %s; want [true]", got)
			}
			// Default 60 s: a TTL of 2 s lapses well within 20.
			clitest.Eventually(t, 20*time.Second, "the token to lapse after --token-ttl 2s", func() bool {
				return clitest.MetricValue(clitest.ScrapeMetrics(t, url), "alkblobfs_pin_tokens", "") == 0
			})
			if got := renew(); got != `{"present":[false]}` {
				t.Fatalf("renewal after the TTL: %s; want [false]", got)
			}
		})
	}
}

// TestDataDirPrivate: docs/operations.md says every file of a data
// directory is created 0600 (a large blob's file 0444) and every directory
// 0700: after puts, a mount that writes, sweeps and scrubs, and its log.
// That log is mount.log in the data directory, and holds what
// docs/troubleshooting.md says a mount logs at info: its start and stop,
// namespace changes, sweeps and scrubs.
func TestDataDirPrivate(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	dir := t.TempDir()
	small, _, _ := clitest.WriteFile(t, dir, 1000, 21)
	large, _, dl := clitest.WriteFile(t, dir, 300<<10, 22)
	c.OK("put", "--ns", "builds", small, large)
	mnt := t.TempDir()
	// --daemon: its log is mount.log in the data directory.
	c.OK("mount", "--daemon", mnt)
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mnt, "builds", "incoming", "f"), clitest.RandomBytes(200<<10, 23), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "builds", dl)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	clitest.SweepVia(t, mnt)
	if err := os.WriteFile(filepath.Join(mnt, ".alkblobfs", "scrub"), []byte("run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clitest.UnmountAndWait(t, mnt, filepath.Join(c.Data, "mount.log"))
	c.OK("sweep")
	log, err := os.ReadFile(filepath.Join(c.Data, "mount.log"))
	if err != nil {
		t.Fatalf("mount --daemon left no mount.log in the data directory: %v", err)
	}
	for _, msg := range []string{"msg=mounted", `msg="namespace created" namespace=other`, `msg="sweep done"`, `msg="scrub done"`, "msg=unmounted"} {
		if !strings.Contains(string(log), "level=INFO "+msg) {
			t.Errorf("mount.log has no info line %s:\n%s", msg, log)
		}
	}

	seen := 0
	err = filepath.WalkDir(c.Data, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		switch rel, _ := filepath.Rel(c.Data, p); {
		case fi.IsDir():
			want = 0o700
		case strings.HasPrefix(rel, "large/blobs/"):
			want = 0o444
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %#o; want %#o", p, fi.Mode().Perm(), want)
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 8 {
		t.Fatalf("the data directory holds %d entries; the test wrote more", seen)
	}
}

// TestFallocateTool: docs/posix.md says fallocate(2) is EOPNOTSUPP in
// incoming/, and that `fallocate -l SIZE FILE` still creates FILE empty
// before it fails, which then publishes the empty blob.
func TestFallocateTool(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	tool, err := exec.LookPath("fallocate")
	if err != nil {
		t.Skip("no fallocate(1) (util-linux)")
	}
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "builds")
	mnt := t.TempDir()
	clitest.StartDaemon(t, c.Data, mnt)
	out, err := exec.Command(tool, "-l", "1MiB", filepath.Join(mnt, "builds", "incoming", "f")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Operation not supported") {
		t.Fatalf("fallocate -l 1MiB in incoming/: %v, %q; want a failure naming Operation not supported", err, out)
	}
	empty := filepath.Join(mnt, "builds", clitest.Sum(nil))
	clitest.Eventually(t, 10*time.Second, "the empty file fallocate created to be published", func() bool {
		fi, err := os.Stat(empty)
		return err == nil && fi.Size() == 0
	})
}

// heldDaemon starts `mount --daemon` on a store whose kv server accepts
// the daemon's connection and never answers, and returns once the daemon
// is connected, so before it serves: the command, a channel closed when
// it exits, its stderr and the mountpoint.
func heldDaemon(t *testing.T) (*exec.Cmd, chan struct{}, *clitest.SyncBuffer, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- conn // held open, never answered
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case conn := <-accepted:
				conn.Close()
			default:
				return
			}
		}
	})
	data, mnt := t.TempDir(), t.TempDir()
	os.Chmod(data, 0o700)
	log := filepath.Join(t.TempDir(), "mount.log")
	cmd := exec.Command(clitest.Bin, "--data", data, "--kv", "postgres://u@"+ln.Addr().String()+"/db", "mount", "--daemon", "--log-file", log, mnt)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME=")
	stderr := &clitest.SyncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	select {
	case conn := <-accepted:
		accepted <- conn
	case <-done:
		t.Fatalf("mount --daemon exited before its daemon reached the kv server: %s", stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("the daemon did not connect to the kv server within 20s: %s", stderr.String())
	}
	return cmd, done, stderr, mnt
}

// TestMountDaemonInterrupted: docs/mount.md says a `mount --daemon` whose
// command is interrupted before the mount serves stops its daemon and
// returns non-zero.
func TestMountDaemonInterrupted(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	cmd, done, stderr, mnt := heldDaemon(t)
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("mount --daemon still running 30s after SIGINT: %s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(stderr.String(), "interrupted before the mount daemon") {
		t.Fatalf("mount --daemon interrupted: exit %d, %q; want non-zero and the reason", code, stderr.String())
	}
	if clitest.DaemonRunning(mnt) || clitest.IsMounted(t, mnt) {
		t.Fatalf("the daemon of an interrupted mount --daemon is still running or mounted")
	}
}

// TestMountDaemonTimeout: docs/mount.md says a daemon that has not served
// within two minutes is stopped, and `mount --daemon` returns non-zero
// with the reason. The daemon is stopped (SIGSTOP) before it serves.
// Two minutes: ALKBLOBFS_LONG only.
func TestMountDaemonTimeout(t *testing.T) {
	t.Parallel()
	if os.Getenv("ALKBLOBFS_LONG") != "1" {
		t.Skip("waits out the two-minute bound: ALKBLOBFS_LONG=1")
	}
	clitest.RequireFUSE(t)
	cmd, done, stderr, mnt := heldDaemon(t)
	var child int
	clitest.Eventually(t, 10*time.Second, "the daemon's process", func() bool {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err != nil || !slices.Contains(strings.Split(string(b), "\x00"), mnt) {
				continue
			}
			if pid, _ := strconv.Atoi(strings.Split(p, "/")[2]); pid != cmd.Process.Pid {
				child = pid
			}
		}
		return child != 0
	})
	if err := syscall.Kill(child, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("mount --daemon still running after 3 minutes: %s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(stderr.String(), "did not serve within 2m0s, and was stopped") {
		t.Fatalf("mount --daemon whose daemon never served: exit %d, %q; want non-zero and the reason", code, stderr.String())
	}
	if clitest.DaemonRunning(mnt) || clitest.IsMounted(t, mnt) {
		t.Fatalf("the daemon that never served is still running or mounted")
	}
}
