//go:build linux

package fusefs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tree writes a small source tree: files of assorted sizes (kv and large
// tier), a nested directory, an empty file, a duplicate and a symlink.
// It returns the sums of the regular files.
func tree(t *testing.T, dir string, seed uint64) []string {
	t.Helper()
	files := map[string][]byte{
		"a.txt":           []byte("hello alkblobfs\n"),
		"empty":           nil,
		"mid.bin":         randBytes(seed, 200<<10),
		"sub/big.bin":     randBytes(seed+1, 3<<20+17),
		"sub/deeper/x":    randBytes(seed+2, 4096),
		"sub/deeper/same": []byte("hello alkblobfs\n"),
	}
	var sums []string
	for name, b := range files {
		writeFile(t, filepath.Join(dir, name), b)
		sums = append(sums, sum(b))
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return sums
}

// TestTools runs the programs of the write-path contract against
// incoming/ and checks, after each, that the namespace lists exactly the
// expected digests and that every published file hashes to its name.
func TestTools(t *testing.T) {
	t.Parallel() // every write is a forked tool's (see TestMain)
	for _, spec := range storeSpecs {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel() // a mount of its own, and forks only
			testTools(t, spec)
		})
	}
}

func testTools(t *testing.T, spec storeSpec) {
	e := mountStore(t, spec)
	src := t.TempDir()
	sums := tree(t, src, 10)
	one := filepath.Join(src, "sub", "big.bin")
	oneSum := sum(mustRead(t, one))

	t.Run("cp", func(t *testing.T) {
		e.mkns("cp")
		run(t, "", "cp", one, e.path("cp", "incoming")+"/")
		e.expectNS(t, "cp", []string{oneSum})
		// The receipt: same size and content, digest in an xattr.
		if got := fileSum(t, e.path("cp", "incoming", "big.bin")); got != oneSum {
			t.Fatalf("receipt content %s", got)
		}
		if x := strings.TrimSpace(run(t, "", "getfattr", "--absolute-names", "--only-values", "-n", xattrDigest, e.path("cp", "incoming", "big.bin"))); x != oneSum {
			t.Fatalf("receipt xattr %q", x)
		}
		// cp over the receipt again: a new upload, same digest (dedup).
		run(t, "", "cp", one, e.path("cp", "incoming", "big.bin"))
		e.expectNS(t, "cp", []string{oneSum})
	})
	t.Run("cp -a", func(t *testing.T) {
		e.mkns("cpa")
		run(t, "", "cp", "-a", one, filepath.Join(src, "a.txt"), e.path("cpa", "incoming")+"/")
		e.expectNS(t, "cpa", []string{oneSum, sum([]byte("hello alkblobfs\n"))})
		fi, err := os.Stat(e.path("cpa", "incoming", "big.bin"))
		sfi, _ := os.Stat(one)
		if err != nil || !fi.ModTime().Equal(sfi.ModTime()) || fi.Mode() != sfi.Mode() {
			t.Fatalf("cp -a attributes not kept: %v %v vs %v %v", fi.ModTime(), fi.Mode(), sfi.ModTime(), sfi.Mode())
		}
	})
	t.Run("cp -r", func(t *testing.T) {
		e.mkns("cpr")
		run(t, "", "cp", "-r", src, e.path("cpr", "incoming", "tree"))
		e.expectNS(t, "cpr", sums)
		if got, err := os.Readlink(e.path("cpr", "incoming", "tree", "link")); err != nil || got != "a.txt" {
			t.Fatalf("symlink in incoming: %q %v", got, err)
		}
	})
	t.Run("rsync", func(t *testing.T) {
		e.mkns("rs")
		run(t, "", "rsync", "-a", src+"/", e.path("rs", "incoming")+"/")
		e.expectNS(t, "rs", sums)
		// A second pass finds everything up to date.
		out := run(t, "", "rsync", "-a", "--itemize-changes", src+"/", e.path("rs", "incoming")+"/")
		if strings.Contains(out, ">f") {
			t.Fatalf("second rsync pass transferred files:\n%s", out)
		}
		e.expectNS(t, "rs", sums)
		// A changed file goes up again (temp file, then rename over the
		// receipt); the old version stays published.
		changed := append(mustRead(t, filepath.Join(src, "mid.bin")), "tail"...)
		src2 := t.TempDir()
		run(t, "", "cp", "-a", src+"/.", src2)
		writeFile(t, filepath.Join(src2, "mid.bin"), changed)
		run(t, "", "rsync", "-a", src2+"/", e.path("rs", "incoming")+"/")
		e.expectNS(t, "rs", append(sums, sum(changed)))
	})
	t.Run("rsync --inplace", func(t *testing.T) {
		e.mkns("rsi")
		run(t, "", "rsync", "-a", "--inplace", src+"/", e.path("rsi", "incoming")+"/")
		e.expectNS(t, "rsi", sums)
		changed := bytes.Clone(mustRead(t, one))
		changed[100] ^= 0xff
		src2 := t.TempDir()
		run(t, "", "cp", "-a", src+"/.", src2)
		writeFile(t, filepath.Join(src2, "sub", "big.bin"), changed)
		// Same size: make the change visible to rsync's quick check.
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(filepath.Join(src2, "sub", "big.bin"), later, later); err != nil {
			t.Fatal(err)
		}
		run(t, "", "rsync", "-a", "--inplace", "--no-whole-file", src2+"/", e.path("rsi", "incoming")+"/")
		e.expectNS(t, "rsi", append(sums, sum(changed)))
		if got := fileSum(t, e.path("rsi", "incoming", "sub", "big.bin")); got != sum(changed) {
			t.Fatalf("in-place update: receipt is %s", got)
		}
	})
	t.Run("tar -x", func(t *testing.T) {
		e.mkns("tar")
		tarball := filepath.Join(t.TempDir(), "t.tar")
		run(t, src, "tar", "-cf", tarball, ".")
		run(t, e.path("tar", "incoming"), "tar", "-xf", tarball)
		e.expectNS(t, "tar", sums)
	})
	t.Run("dd", func(t *testing.T) {
		e.mkns("dd")
		a, b := randBytes(20, 64<<10), randBytes(21, 8<<10)
		writeFile(t, filepath.Join(src, "dd-a"), a)
		writeFile(t, filepath.Join(src, "dd-b"), b)
		out := e.path("dd", "incoming", "disk.img")
		// Sparse: 3 blocks of zeros, then a.
		run(t, "", "dd", "if="+filepath.Join(src, "dd-a"), "of="+out, "bs=4k", "seek=3", "status=none")
		v1 := append(make([]byte, 3*4096), a...)
		// The listing waits for the first dd's RELEASE. Without it the
		// kernel may deliver that RELEASE after the second dd's OPEN, and
		// v1 is then a version replaced while the file was open, which
		// never shows (docs/publish.md).
		e.expectNS(t, "dd", []string{sum(v1)})
		// Overwrite in the middle, keeping the rest.
		run(t, "", "dd", "if="+filepath.Join(src, "dd-b"), "of="+out, "bs=4k", "seek=5", "conv=notrunc", "status=none")
		v2 := bytes.Clone(v1)
		copy(v2[5*4096:], b)
		e.expectNS(t, "dd", []string{sum(v1), sum(v2)})
		if got := fileSum(t, out); got != sum(v2) {
			t.Fatalf("dd receipt is %s, want %s", got, sum(v2))
		}
	})
	t.Run("shell", func(t *testing.T) {
		e.mkns("sh")
		in := e.path("sh", "incoming")
		sh(t, fmt.Sprintf(`cd %q
for i in $(seq 30); do
  printf 'hello\n' > r.txt
  printf 'more\n' >> r.txt
done
cat %q > c.bin
: > empty
exec 3> fd3.txt; echo one >&3; exec 3>&-
`, in, one))
		e.expectNS(t, "sh", []string{
			sum([]byte("hello\n")), sum([]byte("hello\nmore\n")),
			oneSum, sum(nil), sum([]byte("one\n")),
		})
	})
}

func mustRead(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
