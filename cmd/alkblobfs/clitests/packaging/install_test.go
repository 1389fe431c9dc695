//go:build linux

package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestMakeInstall: make install DESTDIR=… puts the binary, the mount
// helper, gzipped man pages that man(1) renders without a warning (an
// uncompressed one an older install left is gone), shell completions that
// bash loads, and the systemd unit where they belong.
func TestMakeInstall(t *testing.T) {
	t.Parallel()
	dest, out := t.TempDir(), t.TempDir()
	old := filepath.Join(dest, "/usr/local/share/man/man1/alkblobfs.1")
	if err := os.MkdirAll(filepath.Dir(old), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, []byte(".TH OLD 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-s", "-C", "../../../..", "install", "DESTDIR="+dest, "PREFIX=/usr/local",
		"BIN="+filepath.Join(out, "alkblobfs"), "MANOUT="+filepath.Join(out, "man"))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, b)
	}
	// A build on a cold cache is silent for minutes: make says what it does.
	if want := "building " + filepath.Join(out, "alkblobfs") + " (the first build downloads and compiles the dependencies"; !strings.HasPrefix(string(b), want) {
		t.Errorf("make -s install begins %q; want %q", b, want)
	}
	at := func(p string) string { return filepath.Join(dest, p) }
	if fi, err := os.Stat(at("/usr/local/bin/alkblobfs")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("binary: %v", err)
	}
	if target, err := os.Readlink(at("/sbin/" + helperName)); err != nil || target != "/usr/local/bin/alkblobfs" {
		t.Fatalf("mount helper: %q, %v", target, err)
	}
	pages, _ := filepath.Glob(at("/usr/local/share/man/man1/*.1.gz"))
	helper, _ := filepath.Glob(at("/usr/local/share/man/man8/*.8.gz"))
	if len(pages) < 15 || len(helper) != 1 {
		t.Fatalf("gzipped man pages: %d in section 1, %d in section 8", len(pages), len(helper))
	}
	for _, glob := range []string{"/usr/local/share/man/man1/*.1", "/usr/local/share/man/man8/*.8"} {
		if plain, _ := filepath.Glob(at(glob)); len(plain) > 0 {
			t.Errorf("uncompressed man pages beside the gzipped ones: %v", plain)
		}
	}
	for _, p := range append(pages, helper...) {
		if b, err := os.ReadFile(p); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s is not gzip: %v", filepath.Base(p), err)
		}
		c := exec.Command("man", "--warnings", "-l", p)
		c.Env = append(os.Environ(), "MANWIDTH=80", "MAN_KEEP_FORMATTING=0")
		var stderr strings.Builder
		c.Stdout, c.Stderr = nil, &stderr
		if err := c.Run(); err != nil || stderr.Len() > 0 {
			t.Errorf("man -l %s: %v %s", filepath.Base(p), err, stderr.String())
		}
	}
	if b, err := exec.Command("bash", "-c", "source "+at("/usr/local/share/bash-completion/completions/alkblobfs")+" && complete -p alkblobfs").CombinedOutput(); err != nil {
		t.Errorf("bash completion: %v: %s", err, b)
	}
	for _, p := range []string{"/usr/local/share/zsh/site-functions/_alkblobfs", "/usr/local/share/fish/vendor_completions.d/alkblobfs.fish"} {
		if fi, err := os.Stat(at(p)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", p, err)
		}
	}
	unit, err := os.ReadFile(at("/usr/local/lib/systemd/system/alkblobfs@.service"))
	if err != nil || !strings.Contains(string(unit), "ExecStart=/usr/local/bin/alkblobfs mount") {
		t.Errorf("unit: %v", err)
	}
}

// TestSystemdUnit: the example unit parses — sections and the keys the
// README and docs/mount.md promise (Type=notify, an EnvironmentFile, ExecStart of mount,
// the hardening) — and systemd-analyze verify accepts it, run on an
// instance whose ExecStart is the binary under test.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../../../contrib/systemd/alkblobfs@.service")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]map[string]string{}
	section := ""
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			keys[section] = map[string]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("line %d: %q is not KEY=VALUE in a section", i+1, line)
			}
			keys[section][k] = v
		}
	}
	for _, want := range []struct{ section, key, value string }{
		{"Service", "Type", "notify"},
		{"Service", "EnvironmentFile", "-/etc/alkblobfs/alkblobfs.env"},
		{"Service", "ExecStart", "/usr/local/bin/alkblobfs mount %f"},
		{"Service", "ExecReload", "/usr/local/bin/alkblobfs upgrade %f"},
		{"Service", "NotifyAccess", "all"},
		{"Service", "ProtectSystem", "strict"},
		{"Service", "ReadWritePaths", "/var/lib/alkblobfs /run/alkblobfs %f"},
		{"Install", "WantedBy", "multi-user.target"},
	} {
		if got := keys[want.section][want.key]; got != want.value {
			t.Errorf("[%s] %s = %q, want %q", want.section, want.key, got, want.value)
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed: the unit was parsed, not verified")
	}
	unit := filepath.Join(t.TempDir(), "alkblobfs@mnt-blobs.service")
	os.WriteFile(unit, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/alkblobfs", clitest.Bin)), 0o644)
	if out, err := exec.Command("systemd-analyze", "verify", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
