package packaging

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// changelogVersion is CHANGELOG.md's newest released version.
func changelogVersion(t *testing.T, changelog string) string {
	t.Helper()
	b, err := os.ReadFile(changelog)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s has no released entry", changelog)
	}
	return string(m[1])
}

// TestMakeBuildVersion: the binary make build makes says the version of
// CHANGELOG.md's newest release, with the commit after it (0.1.0+g33b8a33)
// unless the checkout is that release, in --version and in its man pages'
// header; a plain go build (TestMain's) still says something true.
func TestMakeBuildVersion(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	exe := filepath.Join(out, "alkblobfs")
	if b, err := exec.Command("make", "-s", "-C", "../../../..", "build", "BIN="+exe).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, b)
	}
	// A position-independent executable (ELF type DYN), as the Makefile says.
	if f, err := elf.Open(exe); err != nil {
		t.Error(err)
	} else {
		if f.Type != elf.ET_DYN {
			t.Errorf("make build's binary is of ELF type %v; want a position-independent executable (ET_DYN)", f.Type)
		}
		f.Close()
	}
	b, err := exec.Command("../../../../scripts/version.sh").Output()
	if err != nil {
		t.Fatalf("scripts/version.sh: %v", err)
	}
	v := strings.TrimSpace(string(b))
	release := changelogVersion(t, "../../../../CHANGELOG.md")
	head, err := exec.Command("git", "rev-parse", "--short=7", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	after := release + "+g" + strings.TrimSpace(string(head))
	if base := strings.TrimSuffix(v, "+dirty"); base != release && base != after {
		t.Errorf("scripts/version.sh = %q; want %s or %s (+dirty for a modified tree)", v, release, after)
	}
	got, err := exec.Command(exe, "--version").Output()
	if err != nil || !regexp.MustCompile(`^alkblobfs `+regexp.QuoteMeta(v)+` go1\.[0-9.]+\n$`).Match(got) {
		t.Errorf("--version of make build's binary: %q, %v; want alkblobfs %s go1.…", got, err, v)
	}
	if err := exec.Command(exe, "man", filepath.Join(out, "man")).Run(); err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"alkblobfs.1", "alkblobfs-mount.1", helperName + ".8"} {
		b, err := os.ReadFile(filepath.Join(out, "man", page))
		if err != nil || !regexp.MustCompile(`(?m)^\.TH .*"alkblobfs `+regexp.QuoteMeta(v)+`"`).Match(b) {
			t.Errorf("%s's .TH does not name alkblobfs %s: %v\n%.200s", page, v, err, b)
		}
	}
	// go build alone: no version set, the build information's.
	c := clitest.NewCLI(t)
	if got := c.OK("--version"); !strings.HasPrefix(got, "alkblobfs (devel)") && !strings.HasPrefix(got, "alkblobfs v") {
		t.Errorf("--version of a plain go build: %q; want the module version, (devel)", got)
	}
}

// TestMakeRelease: in a repository of its own (CHANGELOG.md, the Makefile
// and the scripts), the version moves from the release to a build after
// it to +dirty; make release refuses a modified tree, a version not newer
// than the last, and an empty ## [Unreleased]; otherwise it turns that
// section into ## [X.Y.Z] - today, commits and tags vX.Y.Z, and the
// version is X.Y.Z, in a clone without tags too.
func TestMakeRelease(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	env := append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid", "GIT_CONFIG_GLOBAL=/dev/null")
	run := func(dir string, args ...string) (string, error) {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir, cmd.Env = dir, env
		b, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(b)), err
	}
	must := func(dir string, args ...string) string {
		t.Helper()
		out, err := run(dir, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	for _, f := range []string{"CHANGELOG.md", "Makefile", "scripts/version.sh", "scripts/release.sh"} {
		b, err := os.ReadFile(filepath.Join("../../../..", f))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(repo, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(repo, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A changelog with one release and something unreleased.
	cl := "# Changelog\n\n## [Unreleased]\n\n### Added\n\n- A thing.\n\n## [0.1.0] - 2026-12-01\n\n### Added\n\n- The first.\n"
	os.WriteFile(filepath.Join(repo, "CHANGELOG.md"), []byte(cl), 0o644)
	must(repo, "git", "init", "-q")
	must(repo, "git", "add", ".")
	must(repo, "git", "commit", "-q", "-m", "0.1.0")
	version := func(dir string) string { t.Helper(); return must(dir, "scripts/version.sh") }
	short := func() string { t.Helper(); return must(repo, "git", "rev-parse", "--short=7", "HEAD") }

	if v := version(repo); v != "0.1.0" {
		t.Errorf("at the commit that wrote ## [0.1.0]: version %q; want 0.1.0", v)
	}
	os.WriteFile(filepath.Join(repo, "code"), []byte("x\n"), 0o644)
	must(repo, "git", "add", "code")
	must(repo, "git", "commit", "-q", "-m", "work")
	if v, want := version(repo), "0.1.0+g"+short(); v != want {
		t.Errorf("a commit after 0.1.0: version %q; want %s", v, want)
	}
	os.WriteFile(filepath.Join(repo, "code"), []byte("y\n"), 0o644)
	if v, want := version(repo), "0.1.0+g"+short()+"+dirty"; v != want {
		t.Errorf("a modified tree: version %q; want %s", v, want)
	}
	if out, err := run(repo, "make", "-s", "release", "VERSION=0.2.0"); err == nil || !strings.Contains(out, "uncommitted changes") {
		t.Errorf("make release in a modified tree: %v\n%s", err, out)
	}
	must(repo, "git", "checkout", "-q", "code")
	for _, bad := range []struct{ v, why string }{{"0.1.0", "not newer"}, {"0.0.9", "not newer"}, {"1.0", "want X.Y.Z"}, {"", "want X.Y.Z"}} {
		if out, err := run(repo, "make", "-s", "release", "VERSION="+bad.v); err == nil || !strings.Contains(out, bad.why) {
			t.Errorf("make release VERSION=%s: %v\n%s; want %q", bad.v, err, out, bad.why)
		}
	}

	before := short()
	out := must(repo, "make", "-s", "release", "VERSION=0.2.0")
	if !strings.Contains(out, "tagged v0.2.0") {
		t.Errorf("make release says %q", out)
	}
	b, _ := os.ReadFile(filepath.Join(repo, "CHANGELOG.md"))
	today := time.Now().UTC().Format("2006-01-02")
	if want := "## [Unreleased]\n\n## [0.2.0] - " + today + "\n\n### Added\n\n- A thing.\n\n## [0.1.0] - 2026-12-01\n"; !strings.Contains(string(b), want) {
		t.Errorf("CHANGELOG.md after make release:\n%s\nwant it to contain:\n%s", b, want)
	}
	if got := must(repo, "git", "rev-parse", "--short=7", "v0.2.0^{commit}"); got != short() || got == before {
		t.Errorf("v0.2.0 tags %s; want the new commit %s", got, short())
	}
	if st := must(repo, "git", "status", "--porcelain"); st != "" {
		t.Errorf("make release left changes: %s", st)
	}
	if v := version(repo); v != "0.2.0" {
		t.Errorf("at the release: version %q; want 0.2.0", v)
	}
	// A clone that carries no tags: the changelog's heading still says it.
	clone := filepath.Join(t.TempDir(), "clone")
	must(repo, "git", "clone", "-q", "--no-tags", repo, clone)
	if tags := must(clone, "git", "tag"); tags != "" {
		t.Fatalf("the clone has tags %q", tags)
	}
	if v := version(clone); v != "0.2.0" {
		t.Errorf("a clone without tags, at the release: version %q; want 0.2.0", v)
	}
	if out, err := run(repo, "make", "-s", "release", "VERSION=0.3.0"); err == nil || !strings.Contains(out, "lists nothing") {
		t.Errorf("make release with an empty ## [Unreleased]: %v\n%s", err, out)
	}
}
