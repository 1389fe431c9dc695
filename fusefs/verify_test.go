//go:build linux

package fusefs

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// TestVerifyStrict: with --verify=strict every read path goes through the
// daemon and checks what it serves, so a byte changed on disk is EIO even
// right after the blob was read whole (no page cache kept between opens,
// no passthrough), and content whose chunk checksums were rewritten to
// match it still fails the sha256 of a whole read.
func TestVerifyStrict(t *testing.T) {
	e := mountStore(t, defaultSpec, withVerify(VerifyStrict))
	e.mkns("s")
	content := randBytes(31, 8<<20)
	d := e.put("s", content).String()
	p := e.path("s", d)
	ctx := context.Background()
	for i := range 2 {
		if got := fileSum(t, p); got != d {
			t.Fatalf("read %d: %s", i, got)
		}
	}
	eventually(t, 30*time.Second, "the releases", func() bool { return e.srv.Stats(ctx).OpenHandles == 0 })
	if n := e.srv.Stats(ctx).Passthrough.Opens; n != 0 {
		t.Fatalf("%d passthrough opens in --verify=strict", n)
	}

	// A byte flipped in chunk 40, whose checksum no longer matches.
	onDisk := e.blobFile(d)
	const bad = 40<<16 + 123
	flipByte(t, onDisk, bad)
	// Opened before any read finds the flip: the first that does records
	// the blob corrupt, and opens are refused from then on.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(p); err == nil {
		t.Fatal("read(2) of a blob changed on disk succeeded: the page cache of an earlier open was served")
	} else {
		wantErrno(t, "read(2)", err, syscall.EIO)
	}
	buf := make([]byte, 4096)
	_, err = f.ReadAt(buf, bad-100)
	wantErrno(t, "pread over the flipped byte", err, syscall.EIO)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatalf("pread of an intact chunk: %v", err)
	}
	f.Close()
	if out, err := exec.Command("dd", "if="+p, "of=/dev/null", "bs=64k", "skip=40", "count=1").CombinedOutput(); err == nil {
		t.Fatalf("dd over the flipped byte succeeded: %s", out)
	}
	if out, err := mmapSum(p); err == nil {
		t.Fatalf("mmap read of the flipped byte succeeded: %s", out)
	}

	// The same flip with the chunk checksums rewritten to match it: only
	// the end-to-end sha256 can tell, and a whole read gets EIO before
	// it can see EOF.
	// (Another blob: the reads above recorded the first one corrupt.)
	content2 := randBytes(32, 8<<20)
	d2 := e.put("s", content2).String()
	p2 := e.path("s", d2)
	changed := append([]byte(nil), content2...)
	changed[bad] ^= 0x01
	flipByte(t, e.blobFile(d2), bad)
	rewriteSums(t, e.data, d2, changed)
	out, err := exec.Command("sh", "-c", fmt.Sprintf("sha256sum < %q", p2)).CombinedOutput()
	if err == nil {
		t.Fatalf("sha256sum of content with matching chunk checksums succeeded: %s", out)
	}
	_, err = os.ReadFile(p2)
	wantErrno(t, "whole read with matching chunk checksums", err, syscall.EIO)
	if logs := e.logs.String(); !strings.Contains(logs, d2) || !strings.Contains(logs, "from 0 to its end hashes to") {
		t.Fatalf("no log line naming the digest and the sha256 failure:\n%s", logs)
	}
}

// TestScrubFindsBitRot: bytes changed under the filesystem (bit rot: the
// file's metadata is untouched, so the identity check at open cannot see
// it) are found by a scrub, which reads the medium; the blob is then EIO
// at open, until its file is restored.
func TestScrubFindsBitRot(t *testing.T) {
	for _, tc := range []struct {
		trigger string
		verify  Verify
	}{{"control file", VerifyFull}, {"timer", VerifyFull}, {"control file", VerifyPublish}} {
		trigger := tc.trigger
		t.Run(trigger+"/"+string(tc.verify), func(t *testing.T) {
			requireFUSE(t)
			data, img := loopExt4(t)
			opts := []mountOpt{withVerify(tc.verify)}
			if trigger == "timer" {
				opts = append(opts, func(c *Config) { c.ScrubEvery = time.Second })
			}
			e := mountOn(t, data, defaultSpec.open(t, data), opts...)
			e.mkns("r")
			content := randBytes(41, 8<<20)
			d := e.put("r", content).String()
			p := e.path("r", d)
			ctx := context.Background()
			for i := range 2 { // verified, then passed through
				if got := fileSum(t, p); got != d {
					t.Fatalf("read %d: %s", i, got)
				}
				eventually(t, 30*time.Second, "the release", func() bool { return e.srv.Stats(ctx).OpenHandles == 0 })
			}
			onDisk := e.blobFile(d)
			before := fileID(t, onDisk)
			const bad = 3<<20 + 77
			rotByte(t, img, onDisk, bad)
			if after := fileID(t, onDisk); after != before {
				t.Fatalf("the rot changed the file's identity: %+v -> %+v", before, after)
			}

			if trigger == "control file" {
				writeFile(t, e.path(".alkblobfs", "scrub"), []byte("run\n"))
				var rep upkeep.ScrubReport
				b, err := os.ReadFile(e.path(".alkblobfs", "scrub"))
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(b, &rep); err != nil {
					t.Fatalf("scrub report %q: %v", b, err)
				}
				if rep.Corrupt != 1 || rep.Checked != 1 || len(rep.BadDigests) != 1 || rep.BadDigests[0] != d {
					t.Fatalf("scrub report: %s", b)
				}
			} else {
				// Found counts during a run, Runs and Last at its end:
				// wait for the run that found the rot to finish.
				eventually(t, 20*time.Second, "a timed scrub finding the rot, and its end", func() bool {
					st := e.srv.Stats(ctx).Scrub
					return st.Found > 0 && st.Runs > 0 && st.Last != nil
				})
			}
			st := e.srv.Stats(ctx).Scrub
			if st.Found != 1 || st.Refused != 1 || st.Runs == 0 || st.Last == nil {
				t.Fatalf("scrub stats: %+v", st)
			}
			_, err := os.ReadFile(p)
			wantErrno(t, "read of a blob a scrub found corrupt", err, syscall.EIO)
			if logs := e.logs.String(); !regexp.MustCompile(`scrub: blob is corrupt.*` + d).MatchString(logs) {
				t.Fatalf("no log line naming the corrupt digest:\n%s", logs)
			}

			// A chmod changes the file's ctime, not its bytes: still
			// never served (suspect until verified), in every mode.
			if err := os.Chmod(onDisk, 0o640); err != nil {
				t.Fatal(err)
			}
			_, err = os.ReadFile(p)
			wantErrno(t, "read of a corrupt blob whose file was chmod-ed", err, syscall.EIO)

			// Restored through the filesystem (new ctime): verified
			// again at the next open, and served.
			f, err := os.OpenFile(onDisk, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(content[bad:bad+1], bad); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if got := fileSum(t, p); got != d {
				t.Fatalf("read after the restore: %s", got)
			}
		})
	}
}

// TestScrubInterrupted: the write of "run" to the scrub control file lasts
// as long as the scrub, and interrupting the writer stops the scrub.
func TestScrubInterrupted(t *testing.T) {
	e := mountStore(t, defaultSpec, func(c *Config) { c.ScrubRate = 1e6 })
	e.mkns("i")
	e.put("i", randBytes(51, 8<<20)) // 8 s at 1 MB/s
	// The writer is interrupted once its scrub runs, not after a guess at
	// how long the shell takes to start. The scrubs started are counted
	// before the writer starts: its scrub may start before it is waited for.
	started := func() int { return strings.Count(e.logs.String(), "scrub started") }
	scrubbing := func(n int) {
		t.Helper()
		eventually(t, 30*time.Second, "the scrub to start", func() bool { return started() > n })
	}
	n := started()
	cmd := exec.Command("sh", "-c", "echo run > "+e.path(".alkblobfs", "scrub"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scrubbing(n)
	start := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err == nil {
		t.Fatal("the interrupted scrub write succeeded")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the writer took %s to stop after SIGINT", d)
	}
	ctx := context.Background()
	eventually(t, 30*time.Second, "the scrub's report", func() bool { return e.srv.Stats(ctx).Scrub.Last != nil })
	rep := e.srv.Stats(ctx).Scrub.Last
	if rep.Checked != 0 || !strings.Contains(rep.Error, "canceled") {
		t.Fatalf("report of the interrupted scrub: %+v", rep)
	}

	// An unmount does not wait for a scrub run from the control file.
	n = started()
	cmd = exec.Command("sh", "-c", "echo run > "+e.path(".alkblobfs", "scrub"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scrubbing(n)
	start = time.Now()
	done := make(chan error, 1)
	go func() { done <- e.srv.Unmount() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("unmount waited for the scrub")
	}
	cmd.Wait()
	t.Logf("unmounted in %s while a scrub ran", time.Since(start).Round(time.Millisecond))
}

// blobFile is the local engine's file of digest d.
func (e *env) blobFile(d string) string {
	return filepath.Join(e.data, "large", "blobs", d[:2], d)
}

func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// rewriteSums replaces the local engine's chunk checksums of d with those
// of content (CRC-32C per 64 KiB chunk after an 8-byte header: the
// format store writes).
func rewriteSums(t testing.TB, data, d string, content []byte) {
	t.Helper()
	const chunk = 64 << 10
	tab := crc32.MakeTable(crc32.Castagnoli)
	b := make([]byte, 8, 8+4*(len(content)/chunk+1))
	b[0] = 1
	binary.LittleEndian.PutUint32(b[4:], chunk)
	for off := 0; off < len(content); off += chunk {
		b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(content[off:min(off+chunk, len(content))], tab))
	}
	p := filepath.Join(data, "large", "sums", d[:2], d)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the blob's checksums: %v", err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func mmapSum(path string) ([]byte, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "FUSEFS_TEST_MMAP="+path)
	return cmd.CombinedOutput()
}

func fileID(t testing.TB, path string) engines.FileID {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := engines.FileIDOf(f)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// loopExt4 mounts a fresh 128 MiB ext4 image on a loop device and returns
// the directory (for a store's data) and the image file, whose bytes can
// then be changed under the filesystem, as the medium would. Root only.
func loopExt4(t testing.TB) (data, img string) {
	t.Helper()
	tmp := t.TempDir()
	img = filepath.Join(tmp, "fs.img")
	dir := filepath.Join(tmp, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = errors.Join(f.Truncate(128<<20), f.Close())
	}
	if err != nil {
		t.Fatal(err)
	}
	run(t, "", "mkfs.ext4", "-q", "-F", "-b", "4096", img)
	run(t, "", "mount", "-o", "loop", img, dir)
	t.Cleanup(func() {
		// The kernel may still hold a passthrough backing file of the
		// FUSE mount just unmounted for a moment: retry, then detach.
		var out []byte
		var err error
		for range 50 {
			if out, err = exec.Command("umount", dir).CombinedOutput(); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("umount %s: %v: %s; detaching it", dir, err, out)
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount -l %s: %v: %s", dir, err, out)
		}
	})
	data = filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	return data, img
}

// rotByte flips the byte at off of file (on a loopExt4 filesystem) by
// writing the image under the filesystem: the file's metadata stays as
// it was, and the page cache is dropped so that reads see the change.
func rotByte(t testing.TB, img, file string, off int64) {
	t.Helper()
	syscall.Sync()
	out := run(t, "", "filefrag", "-v", "-b4096", file)
	// " 0:        0..    2047:      10241..     12288:   2048: ..."
	re := regexp.MustCompile(`(?m)^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.`)
	var phys int64 = -1
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		lo, _ := strconv.ParseInt(m[1], 10, 64)
		hi, _ := strconv.ParseInt(m[2], 10, 64)
		start, _ := strconv.ParseInt(m[3], 10, 64)
		if blk := off / 4096; blk >= lo && blk <= hi {
			phys = (start+blk-lo)*4096 + off%4096
		}
	}
	if phys < 0 {
		t.Fatalf("offset %d of %s not in its extents:\n%s", off, file, out)
	}
	flipByte(t, img, phys)
	dropCaches(t)
}
