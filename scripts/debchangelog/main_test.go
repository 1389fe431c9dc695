package main

import (
	"strings"
	"testing"
)

const changelog = `# Changelog

## [Unreleased]

### Added

- A thing, described
  on two lines.

## [0.1.0] - 2026-12-01

### Fixed

- The first.
`

// TestStanzas: a release's version is the top stanza; a build after it
// gets its own above, with the unreleased entries; any other version is
// an error.
func TestStanzas(t *testing.T) {
	var b strings.Builder
	if err := run(&b, strings.NewReader(changelog), "0.1.0+g33b8a33", "Tue, 1 Dec 2026 23:46:15 +0000"); err != nil {
		t.Fatal(err)
	}
	want := `alkblobfs (0.1.0+g33b8a33) unstable; urgency=medium

  * Added: A thing, described on two lines.

 -- alkblobfs developers <alkblobfs@users.noreply.github.com>  Tue, 01 Dec 2026 23:46:15 +0000

alkblobfs (0.1.0) unstable; urgency=medium

  * Fixed: The first.

 -- alkblobfs developers <alkblobfs@users.noreply.github.com>  Tue, 01 Dec 2026 00:00:00 +0000
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	if err := run(&b, strings.NewReader(changelog), "0.1.0", ""); err != nil || !strings.HasPrefix(b.String(), "alkblobfs (0.1.0) unstable") {
		t.Errorf("the release itself: %v\n%s", err, b.String())
	}
	if err := run(&b, strings.NewReader(changelog), "0.2.0", ""); err == nil {
		t.Error("a version CHANGELOG.md does not know: no error")
	}
	if err := run(&b, strings.NewReader("## [Unreleased]\n- x\n"), "0.1.0", ""); err == nil {
		t.Error("no released entry: no error")
	}
}
