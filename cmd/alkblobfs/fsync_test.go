//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"golang.org/x/sys/unix"
)

// TestFsyncSurvivesKill: an fsync of a file in incoming/ that returned 0
// keeps what was written so far through a kill -9 of the daemon before
// the file is closed: the next mount publishes the last fsynced version,
// or the version a later close committed, and nothing written after them.
func TestFsyncSurvivesKill(t *testing.T) {
	// Not parallel: its files open on the mount must see no close but its
	// own, and another test's fork and exec closes copies of them (a FLUSH each).
	clitest.RequireFUSE(t)
	data, mnt := clitest.NewCLI(t).Data, t.TempDir()
	d := clitest.StartDaemon(t, data, mnt)
	ns := filepath.Join(mnt, "ns")
	if err := os.Mkdir(ns, 0o755); err != nil {
		t.Fatal(err)
	}
	open := func(name string) *os.File {
		f, err := os.Create(filepath.Join(ns, "incoming", name))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	write := func(f *os.File, b []byte) {
		if _, err := f.Write(b); err != nil {
			t.Fatalf("write %s: %v", f.Name(), err)
		}
	}
	// dd conv=fsync, the tool's own form: its fsync returns 0 (dd checks
	// it), and its close publishes the file before the kill.
	ddSrc := filepath.Join(t.TempDir(), "dd")
	ddBytes := clitest.RandomBytes(200_000, 99)
	if err := os.WriteFile(ddSrc, ddBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("dd", "if="+ddSrc, "of="+filepath.Join(ns, "incoming", "dd"), "bs=64k", "conv=fsync", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd conv=fsync: %v\n%s", err, out)
	}
	want := []string{clitest.Sum(ddBytes)}

	// From here on, no fork: a child's exec closes its copies of the
	// descriptors below, and each such close is a close (FLUSH) of the
	// file that commits what was written so far.
	var files []*os.File
	for i, size := range []int{1000, 300_000} {
		// fsynced, then written again: the fsynced version survives.
		synced, later := clitest.RandomBytes(size, uint64(10+i)), clitest.RandomBytes(size, uint64(20+i))
		f := open(fmt.Sprint("synced-", size))
		write(f, synced)
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync: %v", err)
		}
		write(f, later)
		want = append(want, clitest.Sum(synced))

		// fsynced, then closed through a dup after more writes: the
		// close's version supersedes the fsynced one.
		g := open(fmt.Sprint("superseded-", size))
		write(g, synced)
		if err := unix.Fdatasync(int(g.Fd())); err != nil {
			t.Fatalf("fdatasync: %v", err)
		}
		write(g, later)
		fd, err := unix.Dup(int(g.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Close(fd); err != nil {
			t.Fatalf("close of a dup: %v", err)
		}
		write(g, []byte("never closed"))
		want = append(want, clitest.Sum(append(bytes.Clone(synced), later...)))
		files = append(files, f, g)
	}
	d.Cmd.Process.Kill()
	d.Wait(20 * time.Second)
	for _, f := range files {
		f.Close() // ENOTCONN: the daemon is gone
	}
	if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after kill -9, stat of the mountpoint: %v (want ENOTCONN)", err)
	}

	d2 := clitest.StartDaemon(t, data, mnt)
	slices.Sort(want)
	var got []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		ents, err := os.ReadDir(ns)
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, e := range ents {
			if e.Name() != "incoming" {
				got = append(got, e.Name())
			}
		}
		if slices.Equal(got, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // recovery links the intents as the mount starts
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after the crash the namespace lists\n  %v\nwant (the fsynced or closed versions)\n  %v\nlog:\n%s", got, want, d2.Stderr.String())
	}
	for _, name := range got {
		if s := clitest.FileSHA(t, filepath.Join(ns, name)); s != name {
			t.Fatalf("%s hashes to %s", name, s)
		}
	}
	d2.Cmd.Process.Signal(syscall.SIGTERM)
	if code := d2.Wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d:\n%s", code, d2.Stderr.String())
	}
}
