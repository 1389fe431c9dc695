package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// build compiles the package pkg (relative to the module root) into dir.
func build(t *testing.T, pkg, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// daemon runs bin with args in the background until the test ends, and
// waits until its log says it serves; the log is returned.
func daemon(t *testing.T, mnt string, bin string, args ...string) *fusetest.Buffer {
	t.Helper()
	log := &fusetest.Buffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s exited with %v:\n%s", bin, err, log)
			}
		case <-time.After(20 * time.Second):
			// a stuck daemon must not hang the suite: detach and kill it
			syscall.Unmount(mnt, syscall.MNT_DETACH)
			cmd.Process.Kill()
			t.Errorf("%s did not exit 20 s after SIGTERM:\n%s", bin, log)
		}
	})
	fusetest.Eventually(t, 30*time.Second, bin+" to log msg=mounted", func() bool {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s exited before mounting (%v):\n%s", bin, err, log)
		default:
		}
		return strings.Contains(log.String(), "msg=mounted")
	})
	return log
}

// TestFloorCopies: cp -r, tar -x and rsync -a (which renames its temporary
// files and sets owners, modes and times) into the floor's incoming/ all
// exit 0, and the tree they leave shows every name with its size, so that
// the bench's floor rows cannot break silently.
func TestFloorCopies(t *testing.T) {
	fusetest.RequireFUSE(t)
	for _, c := range []string{"rsync", "tar", "cp"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("%s missing (scripts/ci-deps.sh installs it)", c)
		}
	}
	dir := t.TempDir()
	bin := build(t, "./scripts/fusefloor", dir)
	mnt := filepath.Join(dir, "mnt")
	src := filepath.Join(dir, "src")
	for _, d := range []string{mnt, filepath.Join(src, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const n = 50
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range n {
		p := filepath.Join(src, fmt.Sprintf("f%02d", i))
		if i%2 == 1 {
			p = filepath.Join(src, "sub", fmt.Sprintf("f%02d", i))
		}
		if err := os.WriteFile(p, make([]byte, 4096+i), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	tarball := filepath.Join(dir, "src.tar")
	runOK(t, "tar", "-c", "-f", tarball, "-C", src, ".")
	daemon(t, mnt, bin, mnt)
	inc := filepath.Join(mnt, "bench", "incoming")

	runOK(t, "cp", "-r", src, filepath.Join(inc, "cp"))
	if err := os.Mkdir(filepath.Join(inc, "tar"), 0o755); err != nil {
		t.Fatal(err)
	}
	runOK(t, "tar", "-x", "-f", tarball, "-C", filepath.Join(inc, "tar"))
	runOK(t, "rsync", "-a", src+"/", filepath.Join(inc, "rsync")+"/")

	for _, into := range []string{"cp", "tar", "rsync"} {
		got := 0
		err := filepath.Walk(filepath.Join(inc, into), func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() {
				return err
			}
			got++
			var i int
			if _, err := fmt.Sscanf(fi.Name(), "f%02d", &i); err != nil {
				return fmt.Errorf("%s: a name the copy did not write (a temporary file left?)", p)
			}
			if fi.Size() != int64(4096+i) {
				return fmt.Errorf("%s: size %d, want %d", p, fi.Size(), 4096+i)
			}
			if into != "cp" && (!fi.ModTime().Equal(old) || fi.Mode().Perm() != 0o640) {
				return fmt.Errorf("%s: mtime %s mode %v, want %s and 0640 (%s keeps them)", p, fi.ModTime(), fi.Mode().Perm(), old, into)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		if got != n {
			t.Errorf("%s: %d files in the floor, want %d", into, got, n)
		}
	}
}

func runOK(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// TestFloorMatchesMount: the floor and `alkblobfs mount` tell the kernel
// the same things, so that the floor measures the product's go-fuse setup
// and not another: the same INIT reply (capabilities, max_write,
// readahead, max_background, congestion threshold, max_pages), the same
// mount options and bdi readahead, the same entry and attribute timeouts, the same open
// flags for a file created for writing (FOPEN_DIRECT_IO) and the same
// st_blksize for it. fusefloor cannot import fusefs's settings, so a
// change there must be copied into main.go, and this test says which.
func TestFloorMatchesMount(t *testing.T) {
	fusetest.RequireFUSE(t)
	dir := t.TempDir()
	floor := build(t, "./scripts/fusefloor", dir)
	alk := build(t, "./cmd/alkblobfs", dir)
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	runOK(t, alk, "--data", data, "ns", "create", "bench")

	type seen struct {
		init, lookup, create, options, readahead string
		blksize                                  int64
	}
	look := func(mnt string, log *fusetest.Buffer) seen {
		t.Helper()
		f := filepath.Join(mnt, "bench", "incoming", "x")
		if err := os.WriteFile(f, []byte("hello"), 0o644); err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(f, &st); err != nil {
			t.Fatal(err)
		}
		var s seen
		s.blksize = int64(st.Blksize)
		fusetest.Eventually(t, 10*time.Second, "the CREATE reply in the debug log of "+mnt, func() bool {
			return reply(log.String(), "CREATE") != ""
		})
		s.init = reply(log.String(), "INIT")
		// the entry and attribute timeouts of bench's lookup
		s.lookup = regexp.MustCompile(`tE=\S+ tA=\S+`).FindString(reply(log.String(), `LOOKUP n1  \\?"bench\\?"`))
		// the open flags: what follows the file handle's number
		s.create = regexp.MustCompile(`\{Fh \d+ ([^}]*)\}`).FindStringSubmatch(reply(log.String(), "CREATE") + "{Fh 0 none}")[1]
		s.options = mountOptions(t, mnt)
		// both raise the mount's readahead past the kernel's 128 KiB
		b, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)))
		if err != nil {
			t.Fatal(err)
		}
		s.readahead = strings.TrimSpace(string(b))
		return s
	}

	mA := filepath.Join(dir, "alk")
	mF := filepath.Join(dir, "floor")
	for _, m := range []string{mA, mF} {
		if err := os.Mkdir(m, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := look(mA, daemon(t, mA, alk, "--data", data, "mount", "--debug", mA))
	got := look(mF, daemon(t, mF, floor, "-debug", mF))
	if want.init == "" || want.lookup == "" || want.create == "" {
		t.Fatalf("alkblobfs's debug log lacks a reply the test reads: %+v", want)
	}
	if got != want {
		t.Errorf("the floor differs from alkblobfs mount (copy fusefs/mount.go's settings into scripts/fusefloor/main.go):\n floor:     %+v\n alkblobfs: %+v", got, want)
	}
}

// reply finds in a go-fuse debug log the request whose line matches op
// (a regexp after "rx N: ") and returns the text of its reply, "" if none.
func reply(log, op string) string {
	m := regexp.MustCompile(`rx (\d+): ` + op).FindStringSubmatch(log)
	if m == nil {
		return ""
	}
	r := regexp.MustCompile(`tx ` + m[1] + `:\s+(.*?)(?:"|\n|$)`).FindStringSubmatch(log)
	if r == nil {
		return ""
	}
	return r[1]
}

// mountOptions is the mount's per-mount and super options from
// /proc/self/mountinfo, without the source and type, which name the
// daemon.
func mountOptions(t *testing.T, mnt string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(mnt)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[4] != real {
			continue
		}
		// f[5] the mount options; after "-": type, source, super options
		for i := 6; i < len(f)-3; i++ {
			if f[i] == "-" {
				return f[5] + " " + f[i+3]
			}
		}
	}
	t.Fatalf("%s is not in /proc/self/mountinfo", mnt)
	return ""
}
