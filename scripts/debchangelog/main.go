// Command debchangelog writes the Debian changelog of the package
// (/usr/share/doc/alkblobfs/changelog.gz) from CHANGELOG.md: a stanza per
// released entry, newest first, each item a "*" line under its kind of
// change. make deb runs it:
//
//	go run ./scripts/debchangelog -version 0.1.0+g33b8a33 -date "$(git log -1 --format=%cD)" CHANGELOG.md
//
// A version that is not a released entry's (a build after the release,
// scripts/version.sh) gets a stanza of its own on top, with the entries
// of ## [Unreleased]: Debian wants the package's version to be the
// changelog's newest.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"
)

const maintainer = "alkblobfs developers <alkblobfs@users.noreply.github.com>"

func main() {
	version := flag.String("version", "", "the package's version (scripts/version.sh)")
	date := flag.String("date", "", "the date of a build's own stanza, RFC 2822 (git log -1 --format=%cD; default now)")
	flag.Parse()
	if flag.NArg() != 1 || *version == "" {
		fmt.Fprintln(os.Stderr, "usage: debchangelog -version V [-date RFC2822] CHANGELOG.md")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err == nil {
		defer f.Close()
		err = run(os.Stdout, f, *version, *date)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "debchangelog:", err)
		os.Exit(1)
	}
}

// entry is one ## section of CHANGELOG.md.
type entry struct {
	version string // "" for Unreleased
	date    time.Time
	items   []string // "Kind: text", one line each
}

var (
	released   = regexp.MustCompile(`^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$`)
	unreleased = regexp.MustCompile(`^## \[Unreleased\]$`)
)

// parse reads the entries of a Keep a Changelog file.
func parse(r io.Reader) ([]entry, error) {
	var out []entry
	var cur *entry
	kind := ""
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case unreleased.MatchString(line):
			out = append(out, entry{})
			cur, kind = &out[len(out)-1], ""
		case released.MatchString(line):
			m := released.FindStringSubmatch(line)
			d, err := time.Parse("2006-01-02", m[2])
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", n, err)
			}
			out = append(out, entry{version: m[1], date: d})
			cur, kind = &out[len(out)-1], ""
		case strings.HasPrefix(line, "## "):
			return nil, fmt.Errorf("line %d: %q: want ## [Unreleased] or ## [X.Y.Z] - YYYY-MM-DD", n, line)
		case cur == nil:
		case strings.HasPrefix(line, "### "):
			kind = strings.TrimSpace(line[4:])
		case strings.HasPrefix(line, "- "):
			cur.items = append(cur.items, kind+": "+strings.TrimSpace(line[2:]))
		case strings.HasPrefix(line, "  ") && strings.TrimSpace(line) != "" && len(cur.items) > 0:
			cur.items[len(cur.items)-1] += " " + strings.TrimSpace(line)
		}
	}
	return out, sc.Err()
}

func run(w io.Writer, r io.Reader, version, date string) error {
	entries, err := parse(r)
	if err != nil {
		return err
	}
	var b strings.Builder
	var pending []string
	top := true
	for _, e := range entries {
		if e.version == "" {
			pending = e.items
			continue
		}
		if top && e.version != version {
			// A build after the release e: its own stanza first.
			if !strings.HasPrefix(version, e.version+"+") {
				return fmt.Errorf("version %s is neither CHANGELOG.md's newest release %s nor a build after it (%s+…)", version, e.version, e.version)
			}
			when := time.Now()
			if date != "" {
				if when, err = time.Parse("Mon, 2 Jan 2006 15:04:05 -0700", date); err != nil {
					return fmt.Errorf("-date %q: want RFC 2822 (git log --format=%%cD): %v", date, err)
				}
			}
			items := pending
			if len(items) == 0 {
				items = []string{"A build after " + e.version + "."}
			}
			stanza(&b, version, items, when)
		}
		top = false
		items := e.items
		if len(items) == 0 {
			items = []string{"Released " + e.version + "."}
		}
		stanza(&b, e.version, items, e.date)
	}
	if top {
		return errors.New("CHANGELOG.md has no released entry (## [X.Y.Z] - YYYY-MM-DD)")
	}
	_, err = io.WriteString(w, strings.TrimSuffix(b.String(), "\n"))
	return err
}

func stanza(b *strings.Builder, version string, items []string, when time.Time) {
	fmt.Fprintf(b, "alkblobfs (%s) unstable; urgency=medium\n\n", version)
	for _, it := range items {
		b.WriteString(wrap(strings.ReplaceAll(it, "`", ""), "  * ", "    "))
	}
	fmt.Fprintf(b, "\n -- %s  %s\n\n", maintainer, when.UTC().Format(time.RFC1123Z))
}

// wrap fills text into lines of at most 78 columns.
func wrap(text, first, rest string) string {
	var b strings.Builder
	line := first
	for _, word := range strings.Fields(text) {
		if len(line)+1+len(word) > 78 && strings.TrimSpace(line) != strings.TrimSpace(first) {
			b.WriteString(line + "\n")
			line = rest
		}
		if line != first && line != rest {
			line += " "
		}
		line += word
	}
	return b.String() + line + "\n"
}
