//go:build linux

package packaging

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
)

// helperName is the mount helper's name, as mount(8) looks it up
// (cmd/alkblobfs's helper.go). Named here again, not imported: the
// packages and make install promise that name.
const helperName = "mount.fuse.alkblobfs"

// debTool finds a program the package test runs: missing, it skips the
// test, or fails it under ALKBLOBFS_REQUIRE_FUSE=1 (make test).
func debTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("ALKBLOBFS_REQUIRE_FUSE") == "1" {
			t.Fatalf("%s is not installed (ALKBLOBFS_REQUIRE_FUSE=1): the package test needs it", name)
		}
		t.Skipf("%s is not installed", name)
	}
}

// TestDebPackage: make deb builds a package that lintian reports nothing
// about (at --fail-on error,warning: a copyright file, a changelog, a PIE
// binary, the libc dependency) and that dpkg -i installs into this
// machine; then an fstab line mounts through mount(8) and its helper,
// man alkblobfs renders, the bash completion completes, systemd-analyze
// verify accepts the unit, and dpkg -r leaves none of the package's files
// behind. Its man pages are gzipped and its binary stripped, as Debian
// policy has them. The package, its binary's --version, its man pages and
// its changelog carry one version, scripts/version.sh's.
func TestDebPackage(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("installing a package needs root")
	}
	clitest.RequireFUSE(t)
	for _, tool := range []string{"dpkg", "dpkg-query", "dpkg-shlibdeps", "lintian", "make", "mount", "umount", "man", "bash", "systemd-analyze"} {
		debTool(t, tool)
	}
	if _, err := os.Stat("/usr/share/bash-completion/bash_completion"); err != nil {
		debTool(t, "bash-completion (the package; make deps installs it)")
	}
	out := t.TempDir()
	start := time.Now()
	mk := exec.Command("make", "-s", "-C", "../../../..", "deb", "BIN="+filepath.Join(out, "alkblobfs"),
		"MANOUT="+filepath.Join(out, "man"), "DEBROOT="+filepath.Join(out, "root"), "DEBOUT="+out)
	if b, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, b)
	}
	debs, _ := filepath.Glob(filepath.Join(out, "alkblobfs_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb made %v; want one alkblobfs_*.deb", debs)
	}
	t.Logf("make deb: %s in %s", filepath.Base(debs[0]), time.Since(start).Round(time.Millisecond))
	// What dpkg-shlibdeps computes for the dynamic binary: libc6 with
	// the least version of its symbols.
	if b, err := exec.Command("dpkg-deb", "-f", debs[0], "Depends").Output(); err != nil ||
		!regexp.MustCompile(`^fuse3, libc6 \(>= 2\.[0-9]+\)$`).MatchString(strings.TrimSpace(string(b))) {
		t.Errorf("Depends: %q, %v; want fuse3, libc6 (>= 2.N)", b, err)
	}
	version, err := exec.Command("../../../../scripts/version.sh").Output()
	if err != nil {
		t.Fatalf("scripts/version.sh: %v", err)
	}
	v := strings.TrimSpace(string(version))
	if b, err := exec.Command("dpkg-deb", "-f", debs[0], "Version").Output(); err != nil || strings.TrimSpace(string(b)) != v {
		t.Errorf("Version: %q, %v; want %s (scripts/version.sh)", b, err, v)
	}
	// Nothing at all: not an error, not a warning (info and pedantic tags
	// are not shown by default).
	lint := exec.Command("lintian", "--fail-on", "error,warning", debs[0])
	if b, err := lint.CombinedOutput(); err != nil || hasLintianTag(string(b)) {
		t.Errorf("lintian --fail-on error,warning %s: %v\n%s", filepath.Base(debs[0]), err, b)
	}

	// The system paths from here on, not during the build (a minute or
	// more): installHelper's tests wait for the lock meanwhile.
	clitest.HelperLock(t)
	if out, err := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Status}", "alkblobfs").Output(); err == nil && string(out) != "not-installed" {
		t.Fatalf("a package alkblobfs is installed (%s): not replacing it", out)
	}
	for _, p := range []string{"/usr/bin/alkblobfs", "/sbin/" + helperName} {
		if _, err := os.Lstat(p); err == nil {
			t.Fatalf("%s exists: not replacing it with the package's", p)
		}
	}

	t.Cleanup(func() { exec.Command("dpkg", "-r", "alkblobfs").Run() }) // if a check below failed
	dpkg(t, "-i", debs[0])
	b, err := exec.Command("dpkg-query", "-L", "alkblobfs").Output()
	if err != nil {
		t.Fatalf("dpkg-query -L alkblobfs: %v", err)
	}
	var files []string // what the package put on the machine, less directories
	for _, p := range clitest.Lines(string(b)) {
		// (On a merged /usr, /sbin is a symlink to a directory.)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			files = append(files, p)
		}
	}
	for _, p := range files {
		if strings.HasPrefix(p, "/usr/share/man/") && !strings.HasSuffix(p, ".gz") {
			t.Errorf("the package installs %s uncompressed: Debian policy gzips man pages", p)
		}
	}
	for _, want := range []string{"/usr/bin/alkblobfs", "/sbin/" + helperName, "/usr/share/man/man1/alkblobfs.1.gz",
		"/usr/share/man/man8/" + helperName + ".8.gz", "/usr/share/bash-completion/completions/alkblobfs",
		"/usr/lib/systemd/system/alkblobfs@.service"} {
		if !slices.Contains(files, want) {
			t.Errorf("the package did not install %s (it lists %v)", want, files)
		}
	}

	// Stripped, as Debian ships binaries (lintian: unstripped-binary-or-object).
	if exe, err := elf.Open("/usr/bin/alkblobfs"); err != nil {
		t.Errorf("/usr/bin/alkblobfs: %v", err)
	} else {
		if exe.Section(".symtab") != nil {
			t.Errorf("/usr/bin/alkblobfs has a symbol table: the package's binary should be linked with -s")
		}
		exe.Close()
	}

	if b, err := exec.Command("/usr/bin/alkblobfs", "--version").Output(); err != nil || !strings.HasPrefix(string(b), "alkblobfs "+v+" go1.") {
		t.Errorf("/usr/bin/alkblobfs --version: %q, %v; want alkblobfs %s go1.…", b, err, v)
	}
	if b, err := exec.Command("sh", "-c", "zcat /usr/share/man/man1/alkblobfs.1.gz | grep '^.TH'").Output(); err != nil || !strings.Contains(string(b), `"alkblobfs `+v+`"`) {
		t.Errorf("alkblobfs(1)'s .TH: %q, %v; want the source \"alkblobfs %s\"", b, err, v)
	}
	if b, err := exec.Command("sh", "-c", "zcat /usr/share/doc/alkblobfs/changelog.gz | head -n 1").Output(); err != nil || !strings.HasPrefix(string(b), "alkblobfs ("+v+") ") {
		t.Errorf("the changelog's first line: %q, %v; want alkblobfs (%s) …", b, err, v)
	}
	if b, err := os.ReadFile("/usr/share/doc/alkblobfs/copyright"); err != nil || !strings.Contains(string(b), "\nFiles: github.com/hanwen/go-fuse/v2/*\n") {
		t.Errorf("/usr/share/doc/alkblobfs/copyright has no paragraph for go-fuse: %v", err)
	}

	debMount(t)

	man := exec.Command("man", "-P", "cat", "alkblobfs")
	man.Env = append(os.Environ(), "MANWIDTH=80", "MAN_KEEP_FORMATTING=0")
	if b, err := man.CombinedOutput(); err != nil || !strings.Contains(string(b), "content-addressed blob store") {
		t.Errorf("man alkblobfs: %v\n%s", err, b)
	}
	// The completion as an interactive bash calls it on "alkblobfs
	// mo<TAB>": bash-completion loads it (and provides the word splitting
	// that cobra's script uses).
	comp := `source /usr/share/bash-completion/bash_completion
source /usr/share/bash-completion/completions/alkblobfs
COMP_LINE="alkblobfs mo"; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(alkblobfs mo); COMP_CWORD=1
__start_alkblobfs
printf '%s\n' "${COMPREPLY[@]}"`
	if b, err := exec.Command("bash", "-c", comp).CombinedOutput(); err != nil || !slices.Contains(clitest.Lines(string(b)), "mount") {
		t.Errorf("bash completion of 'alkblobfs mo': %v: %q; want mount", err, b)
	}
	if b, err := exec.Command("systemd-analyze", "verify", "/usr/lib/systemd/system/alkblobfs@mnt-blobs.service").CombinedOutput(); err != nil || len(b) > 0 {
		t.Errorf("systemd-analyze verify alkblobfs@mnt-blobs.service: %v\n%s", err, b)
	}

	dpkg(t, "-r", "alkblobfs")
	for _, p := range files {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dpkg -r left %s behind (%v)", p, err)
		}
	}
	if b, err := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Status}", "alkblobfs").Output(); err == nil && string(b) != "not-installed" {
		t.Errorf("after dpkg -r the package's status is %q", b)
	}
}

// hasLintianTag says whether lintian's output holds a tag line ("E:
// alkblobfs: tag", "W: …"), besides its notes about running as root.
func hasLintianTag(out string) bool {
	return regexp.MustCompile(`(?m)^[EWIPXO]: `).MatchString(out)
}

// dpkg runs dpkg with args, retrying while another dpkg (an apt-get of
// make deps, say) holds its lock.
func dpkg(t *testing.T, args ...string) {
	t.Helper()
	var b []byte
	clitest.Eventually(t, 2*time.Minute, "dpkg "+strings.Join(args, " ")+" (its lock)", func() bool {
		var err error
		b, err = exec.Command("dpkg", args...).CombinedOutput()
		if err != nil && !strings.Contains(string(b), "lock") {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return err == nil
	})
}

// debMount mounts an fstab line through mount(8), which runs the
// package's helper, writes through the mount, and unmounts with umount(8).
func debMount(t *testing.T) {
	t.Helper()
	data, mnt := t.TempDir(), t.TempDir()
	os.Chmod(data, 0o700)
	fstab := filepath.Join(t.TempDir(), "fstab")
	if err := os.WriteFile(fstab, []byte(fmt.Sprintf("%s %s fuse.alkblobfs defaults 0 0\n", data, mnt)), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("mount", "-T", fstab, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -T %s %s: %v: %s", fstab, mnt, err, b)
	}
	conn, _ := fusetest.Conn(mnt)
	unmounted := false
	t.Cleanup(func() {
		if !unmounted {
			fusetest.GiveUp(t, mnt, conn, "the test stopped with it mounted")
		}
	})
	if b, err := exec.Command("findmnt", "-n", "-o", "SOURCE,FSTYPE", mnt).Output(); err != nil ||
		strings.Join(strings.Fields(string(b)), " ") != data+" fuse.alkblobfs" {
		t.Errorf("findmnt %s: %q, %v; want %s fuse.alkblobfs", mnt, b, err, data)
	}
	if err := os.Mkdir(filepath.Join(mnt, "ns"), 0o755); err != nil {
		t.Errorf("mkdir a namespace through the mount: %v", err)
	}
	if b, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v: %s", mnt, err, b)
	}
	clitest.Eventually(t, 20*time.Second, "the daemon's exit after umount", func() bool { return !clitest.DaemonRunning(mnt) })
	unmounted = true
}
