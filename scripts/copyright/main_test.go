package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

const mitText = `MIT License

Copyright (c) 2020 Jane Doe

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction.

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
`

// fakeModule puts a module with the given files into a module cache dir.
func fakeModule(t *testing.T, cache, path, version string, files map[string]string) module {
	t.Helper()
	if _, err := moduleDir(cache, path, version); err == nil {
		t.Fatalf("%s %s exists already", path, version)
	}
	dir := filepath.Join(cache, escape(path)+"@"+version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := moduleDir(cache, path, version); err != nil || got != dir {
		t.Fatalf("moduleDir(%s) = %s, %v; want %s", path, got, err, dir)
	}
	return module{Path: path, Version: version, Dir: dir, Files: path + "/*"}
}

// TestUnknownLicenseFails: a module whose license file matches no known
// license, or that has none, fails the generation, naming the module; a
// known one (MIT, with its copyright line and text) passes.
func TestUnknownLicenseFails(t *testing.T) {
	cache := t.TempDir()
	good := fakeModule(t, cache, "example.com/Fake", "v1.0.0", map[string]string{"LICENSE.md": mitText})
	if want := filepath.Join(cache, "example.com/!fake@v1.0.0"); good.Dir != want { // the module cache's escaping
		t.Errorf("example.com/Fake is at %s; want %s", good.Dir, want)
	}
	paras, err := describe([]module{good})
	if err != nil || len(paras) != 1 || !slices.Equal(ids(paras[0].licenses), []string{"MIT"}) ||
		!slices.Equal(paras[0].copyright, []string{"2020 Jane Doe"}) || len(paras[0].texts) != 1 {
		t.Fatalf("an MIT module: %+v, %v", paras, err)
	}

	odd := fakeModule(t, cache, "example.com/odd", "v0.1.0", map[string]string{
		"LICENSE": "You may use this code on Tuesdays, if you send the author a postcard.\n"})
	none := fakeModule(t, cache, "example.com/none", "v0.2.0", map[string]string{"README": "no license here\n"})
	_, err = describe([]module{good, odd, none})
	if err == nil {
		t.Fatal("modules with an unknown license and with none: no error")
	}
	for _, want := range []string{"module example.com/odd v0.1.0", "a license not identified", "module example.com/none v0.2.0", "no license file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "example.com/Fake") {
		t.Errorf("error %q names the MIT module", err)
	}
}

// TestLocalReplacement: a module replaced by a directory of the
// repository (a patched copy) takes its license from the copy, and says
// so in its version; a missing directory fails, naming the module.
func TestLocalReplacement(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "third_party", "x")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "LICENSE"), []byte(mitText), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &debug.Module{Path: "example.com/x", Version: "v1.2.3", Replace: &debug.Module{Path: "./third_party/x", Version: "(devel)"}}
	if !isLocalPath(d.Replace.Path) || isLocalPath("example.com/y") {
		t.Fatal("isLocalPath does not tell a directory from a module")
	}
	m, err := localModule(root, d)
	if err != nil {
		t.Fatal(err)
	}
	if m.Dir != dir || m.Version != "v1.2.3, patched copy in third_party/x" {
		t.Errorf("localModule = %+v; want the copy's directory %s and a patched version", m, dir)
	}
	paras, err := describe([]module{m})
	if err != nil || len(paras) != 1 || !slices.Equal(ids(paras[0].licenses), []string{"MIT"}) {
		t.Errorf("the copy's license: %+v, %v", paras, err)
	}
	d.Replace.Path = "./third_party/gone"
	if _, err := localModule(root, d); err == nil || !strings.Contains(err.Error(), "example.com/x") {
		t.Errorf("a missing copy: %v", err)
	}
}

// TestIdentify: the texts the binary's modules carry, reworded as license
// files are (line breaks, "names" for "name"), and the repository's own
// LICENSE.
func TestIdentify(t *testing.T) {
	own, err := identifyFile("../../LICENSE")
	if err != nil || !slices.Equal(ids(own), []string{"Apache-2.0"}) {
		t.Fatalf("LICENSE: %v, %v; want Apache-2.0", ids(own), err)
	}
	bsd := `Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:
* Redistributions in binary form must reproduce the above copyright notice
* Neither the names of the authors nor the names of the
contributors may be used to endorse or promote products derived from
this software without specific prior written permission.`
	for text, want := range map[string][]string{
		mitText: {"MIT"},
		bsd:     {"BSD-3-Clause"},
		strings.ReplaceAll(bsd, "* Neither the names of the authors nor the names of the\ncontributors may be used to endorse or promote products derived from\nthis software without specific prior written permission.", ""): {"BSD-2-Clause"},
		bsd + "\n3. All advertising materials mentioning features": nil,
		"Mozilla Public License Version 2.0\n==================":   {"MPL-2.0"},
	} {
		if got := ids(identify(text)); !slices.Equal(got, want) {
			t.Errorf("identify(%.60q…) = %v; want %v", text, got, want)
		}
	}
}
