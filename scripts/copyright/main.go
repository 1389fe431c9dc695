// Command copyright writes the Debian machine-readable copyright file
// (/usr/share/doc/alkblobfs/copyright) of a built binary: alkblobfs's own
// license, then for the Go toolchain and every module the binary records
// as compiled in (its build information, what go version -m prints) the
// licenses identified from the module's license files in the module
// cache. make deb runs it:
//
//	go run ./scripts/copyright -license LICENSE bin/alkblobfs > copyright
//
// A license is identified by matching its text, normalised (case,
// punctuation, line breaks), against phrases that only that license has;
// a license file that matches none, or a module without one, is an error
// naming it: a package must not ship code whose license nobody read.
package main

import (
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"unicode"
)

func main() {
	license := flag.String("license", "LICENSE", "alkblobfs's own license file")
	modcache := flag.String("modcache", "", "the module cache (default: go env GOMODCACHE)")
	goroot := flag.String("goroot", "", "the Go toolchain's root (default: go env GOROOT)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: copyright [-license FILE] [-modcache DIR] [-goroot DIR] BINARY")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, flag.Arg(0), *license, *modcache, *goroot); err != nil {
		fmt.Fprintln(os.Stderr, "copyright:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, binary, license, modcache, goroot string) error {
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		return err
	}
	if modcache == "" {
		if modcache, err = goEnv("GOMODCACHE"); err != nil {
			return err
		}
	}
	if goroot == "" {
		if goroot, err = goEnv("GOROOT"); err != nil {
			return err
		}
	}
	own, err := identifyFile(license)
	if err != nil {
		return err
	}
	if !slices.Equal(ids(own), []string{"Apache-2.0"}) {
		return fmt.Errorf("%s: want the Apache License 2.0, found %v", license, ids(own))
	}
	mods := []module{{Path: "Go (the toolchain's runtime and standard library)", Version: bi.GoVersion, Dir: goroot, Files: "go/*"}}
	modroot := ""
	for _, d := range bi.Deps {
		if r := d.Replace; r != nil && isLocalPath(r.Path) {
			if modroot == "" {
				gomod, err := goEnv("GOMOD")
				if err != nil {
					return err
				}
				modroot = filepath.Dir(gomod)
			}
			m, err := localModule(modroot, d)
			if err != nil {
				return err
			}
			mods = append(mods, m)
			continue
		}
		if d.Replace != nil {
			d = d.Replace
		}
		dir, err := moduleDir(modcache, d.Path, d.Version)
		if err != nil {
			return err
		}
		mods = append(mods, module{Path: d.Path, Version: d.Version, Dir: dir, Files: d.Path + "/*"})
	}
	paras, err := describe(mods)
	if err != nil {
		return err
	}
	return write(w, paras)
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// module is one body of code compiled into the binary.
type module struct {
	Path, Version, Dir string
	Files              string // its Files: pattern
}

// isLocalPath reports whether a replacement names a directory (a
// patched copy in this repository, such as third_party/go-fuse) rather
// than a module.
func isLocalPath(p string) bool {
	return filepath.IsAbs(p) || p == "." || p == ".." || strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../")
}

// localModule is dependency d replaced by a directory, relative to
// modroot (the main module's): its license files are the copy's, and its
// version says it is patched.
func localModule(modroot string, d *debug.Module) (module, error) {
	dir := d.Replace.Path
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(modroot, dir)
	}
	if _, err := os.Stat(dir); err != nil {
		return module{}, fmt.Errorf("module %s is replaced by %s, which is missing: %w", d.Path, d.Replace.Path, err)
	}
	version := "patched copy in " + filepath.Clean(d.Replace.Path)
	if d.Version != "" {
		version = d.Version + ", " + version
	}
	return module{Path: d.Path, Version: version, Dir: dir, Files: d.Path + "/*"}, nil
}

// moduleDir is where the module cache keeps a module: its path and
// version with each upper-case letter as "!" and the lower-case one.
func moduleDir(modcache, path, version string) (string, error) {
	dir := filepath.Join(modcache, escape(path)+"@"+escape(version))
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("module %s %s is not in the module cache (%v): go mod download it", path, version, err)
	}
	return dir, nil
}

func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// A license as the copyright file names it, and the phrases (normalised)
// that identify its text: all of them must occur, and none of unless; a
// phrase may list variants, "a|b".
type licenseKind struct {
	ID     string
	All    []string
	Unless []string
	// Common is its text's path on every Debian system, if there is one:
	// the file refers to it instead of repeating it (lintian wants that).
	Common string
}

var kinds = []licenseKind{
	{ID: "Apache-2.0", All: []string{"apache license version 2 0", "terms and conditions for use reproduction and distribution"},
		Common: "/usr/share/common-licenses/Apache-2.0"},
	{ID: "MPL-2.0", All: []string{"mozilla public license version 2 0"}, Common: "/usr/share/common-licenses/MPL-2.0"},
	{ID: "MIT", All: []string{"permission is hereby granted free of charge to any person obtaining a copy",
		"the above copyright notice and this permission notice shall be included in all copies or substantial portions"}},
	{ID: "BSD-3-Clause", All: []string{"redistribution and use in source and binary forms with or without modification are permitted",
		"neither the name of|neither the names of", "may be used to endorse or promote products derived from this software without specific prior written permission"},
		Unless: []string{"all advertising materials"}},
	{ID: "BSD-2-Clause", All: []string{"redistribution and use in source and binary forms with or without modification are permitted",
		"redistributions in binary form must reproduce the above copyright notice"},
		Unless: []string{"neither the name of|neither the names of", "all advertising materials", "may be used to endorse or promote"}},
	{ID: "ISC", All: []string{"permission to use copy modify and or distribute this software for any purpose with or without fee is hereby granted"}},
	{ID: "public-domain", All: []string{"the author disclaims copyright to this source code"}},
	{ID: "public-domain", All: []string{"dedicated to the public domain"}, Unless: []string{"permission is hereby granted"}},
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// normalise lower-cases text and reduces everything but letters and
// digits to single spaces: line breaks, punctuation and markup do not
// change what a license says.
func normalise(text string) string {
	return " " + strings.TrimSpace(nonWord.ReplaceAllString(strings.ToLower(text), " ")) + " "
}

// identify names the licenses whose phrases text contains.
func identify(text string) []licenseKind {
	n := normalise(text)
	has := func(phrase string) bool {
		return slices.ContainsFunc(strings.Split(phrase, "|"), func(p string) bool { return strings.Contains(n, " "+p+" ") })
	}
	var found []licenseKind
next:
	for _, k := range kinds {
		for _, p := range k.All {
			if !has(p) {
				continue next
			}
		}
		for _, p := range k.Unless {
			if has(p) {
				continue next
			}
		}
		if !slices.ContainsFunc(found, func(f licenseKind) bool { return f.ID == k.ID }) {
			found = append(found, k)
		}
	}
	return found
}

func identifyFile(path string) ([]licenseKind, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	found := identify(string(b))
	if len(found) == 0 {
		return nil, fmt.Errorf("%s: a license not identified (none of %s): read it, and teach scripts/copyright its text if it allows shipping",
			path, strings.Join(knownIDs(), ", "))
	}
	return found, nil
}

func knownIDs() []string {
	var out []string
	for _, k := range kinds {
		if !slices.Contains(out, k.ID) {
			out = append(out, k.ID)
		}
	}
	return out
}

func ids(ks []licenseKind) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.ID)
	}
	return out
}

var licenseName = regexp.MustCompile(`(?i)^(licen[cs]e|copying|unlicense)([-._].*)?$`)

// notLicenses are files named like licenses that cover nothing compiled
// in, each with the reason.
var notLicenses = map[string]string{
	"modernc.org/memory/LICENSE-LOGO": "the project logo's source, not code",
}

// paragraph is one Files paragraph of the copyright file.
type paragraph struct {
	mod       module
	copyright []string
	licenses  []licenseKind
	texts     []string // the texts of licenses with no common file
	notices   []string // NOTICE files (Apache-2.0 section 4(d))
}

// describe reads every module's license and NOTICE files.
func describe(mods []module) ([]paragraph, error) {
	var paras []paragraph
	var errs []error
	for _, m := range mods {
		entries, err := os.ReadDir(m.Dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p := paragraph{mod: m}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() {
				continue
			}
			full := filepath.Join(m.Dir, name)
			if strings.EqualFold(strings.TrimSuffix(name, filepath.Ext(name)), "NOTICE") {
				b, err := os.ReadFile(full)
				if err != nil {
					errs = append(errs, err)
				}
				p.notices = append(p.notices, strings.TrimSpace(string(b)))
				continue
			}
			if !licenseName.MatchString(name) || notLicenses[m.Path+"/"+name] != "" {
				continue
			}
			found, err := identifyFile(full)
			if err != nil {
				errs = append(errs, fmt.Errorf("module %s %s: %w", m.Path, m.Version, err))
				continue
			}
			b, _ := os.ReadFile(full)
			p.copyright = append(p.copyright, copyrightLines(string(b))...)
			for _, k := range found {
				if !slices.ContainsFunc(p.licenses, func(f licenseKind) bool { return f.ID == k.ID }) {
					p.licenses = append(p.licenses, k)
				}
				if text := elideApache(strings.TrimSpace(string(b))); k.Common == "" && !slices.Contains(p.texts, text) {
					p.texts = append(p.texts, text)
				}
			}
		}
		if len(p.licenses) == 0 && !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), "module "+m.Path+" ") }) {
			errs = append(errs, fmt.Errorf("module %s %s: no license file in %s: its license is unknown", m.Path, m.Version, m.Dir))
		}
		slices.Sort(p.copyright)
		p.copyright = slices.Compact(p.copyright)
		if len(p.copyright) == 0 {
			p.copyright = []string{"the authors of " + m.Path}
		}
		paras = append(paras, p)
	}
	return paras, errors.Join(errs...)
}

// apacheTerms is the Apache License 2.0's own text, from its title to the
// end of its terms.
var apacheTerms = regexp.MustCompile(`(?s)[^\n]*Apache License\s+Version 2\.0, January 2004.*?END OF TERMS AND CONDITIONS`)

// elideApache replaces the Apache License 2.0's terms, in a file that
// quotes them beside other licenses, by the path of their copy on every
// Debian system (lintian: copyright-file-contains-full-apache-2-license).
func elideApache(text string) string {
	return apacheTerms.ReplaceAllLiteralString(text, "[The terms of the Apache License 2.0: /usr/share/common-licenses/Apache-2.0.]")
}

var copyrightLine = regexp.MustCompile(`(?i)^\s*copyright\s+(\(c\)\s*|©\s*)?(.*\d{4}.*)$`)

// copyrightLines are a license file's "Copyright (c) 2009 Someone" lines,
// less the word; the Apache appendix's "[yyyy]" template is not one.
func copyrightLines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		m := copyrightLine.FindStringSubmatch(l)
		if m == nil || strings.Contains(l, "[yyyy]") || strings.Contains(l, "{yyyy}") {
			continue
		}
		out = append(out, strings.TrimSpace(m[2]))
	}
	return out
}

// write prints the file in Debian's machine-readable format 1.0.
func write(w io.Writer, paras []paragraph) error {
	var b strings.Builder
	b.WriteString("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
	b.WriteString("Upstream-Name: alkblobfs\n")
	b.WriteString("Comment: Generated by scripts/copyright from the Go modules compiled into\n /usr/bin/alkblobfs and the license files of each.\n\n")
	b.WriteString("Files: *\nCopyright: the alkblobfs authors\nLicense: Apache-2.0\n")
	common := map[string]string{"Apache-2.0": "/usr/share/common-licenses/Apache-2.0"}
	for _, p := range paras {
		var idl []string
		for _, k := range p.licenses {
			idl = append(idl, k.ID)
			if k.Common != "" {
				common[k.ID] = k.Common
			}
		}
		fmt.Fprintf(&b, "\nFiles: %s\nCopyright: %s\n", p.mod.Files, strings.Join(p.copyright, "\n "))
		if len(p.texts) == 0 {
			fmt.Fprintf(&b, "License: %s\n", strings.Join(idl, " and "))
		} else {
			fmt.Fprintf(&b, "License: %s\n%s\n", strings.Join(idl, " and "), indent(strings.Join(p.texts, "\n\n")))
		}
		fmt.Fprintf(&b, "Comment: %s %s, compiled into /usr/bin/alkblobfs.", p.mod.Path, p.mod.Version)
		for _, n := range p.notices {
			b.WriteString(" Its NOTICE:\n" + indent(n))
		}
		b.WriteString("\n")
	}
	ids := make([]string, 0, len(common))
	for id := range common {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "\nLicense: %s\n On Debian systems the full text of the license is in\n %s.\n", id, common[id])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// indent makes text a field's continuation lines: one space before each,
// " ." for an empty one.
func indent(text string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		l = strings.TrimRight(strings.ReplaceAll(l, "\t", "    "), " \r")
		if l == "" {
			l = "."
		}
		out = append(out, " "+l)
	}
	return strings.Join(out, "\n")
}
