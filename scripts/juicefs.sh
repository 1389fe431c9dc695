#!/usr/bin/env bash
# juicefs.sh — builds JuiceFS, a FUSE peer for the bench, and prints the
# path of its binary on stdout (messages go to stderr).
#
#   scripts/juicefs.sh            # build once, then print the cached binary
#   BENCH_JUICEFS=1 make bench    # bench.sh runs this and mounts juicefs
#
# The source is github.com/juicedata/juicefs at JUICEFS_VERSION (v1.4.1),
# a Go module taken from the Go module proxy with `go mod download` (its
# go.mod has replace directives, so `go install MODULE@VERSION` refuses it),
# copied out of the read-only module cache and built with the build tags of
# its Makefile's juicefs.lite target minus nosqlite: no object stores but
# the local directory, sqlite3 as the only metadata engine (cgo). Nothing
# goes into this repository: the binary is
# ${XDG_CACHE_HOME:-$HOME/.cache}/alkblobfs-bench/juicefs-VERSION (or under
# $BENCH_CACHE), built once and reused. If it cannot be built, the script
# says why and exits 1; the bench then runs without the peer.
set -euo pipefail

ver=${JUICEFS_VERSION:-v1.4.1}
mod=github.com/juicedata/juicefs
cache=${BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/alkblobfs-bench}
out=$cache/juicefs-$ver

fail() {
	echo "juicefs.sh: cannot build juicefs $ver: $*" >&2
	exit 1
}

if [[ -x $out ]] && "$out" --version >/dev/null 2>&1; then
	echo "$out"
	exit 0
fi
command -v go >/dev/null || fail "go is not on PATH"
command -v gcc >/dev/null || fail "gcc is missing (the sqlite3 metadata engine needs cgo)"
mkdir -p "$cache" || fail "cannot create the cache directory $cache"

# Outside any module, so this repository's go.mod plays no part.
cd "$cache"
echo "juicefs.sh: downloading $mod@$ver from the Go module proxy" >&2
if ! dl=$(GOFLAGS=-mod=mod go mod download -json "$mod@$ver" 2>&1); then
	err=$(sed -n 's/^[[:space:]]*"Error": "\(.*\)"$/\1/p' <<<"$dl" | sed 's/\\n\\t/: /g')
	fail "go mod download $mod@$ver failed: ${err:-$dl}"
fi
dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$dl")
[[ -n $dir && -f $dir/Makefile ]] || fail "go mod download gave no source directory with a Makefile: $dl"

# The lite target's tags, minus nosqlite.
tags=$(sed -n '/^juicefs\.lite:/,/^$/p' "$dir/Makefile" | grep -o -- '-tags [^ ]*' | head -1 | cut -d' ' -f2)
[[ -n $tags ]] || fail "no -tags in the juicefs.lite target of $dir/Makefile"
tags=$(tr ',' '\n' <<<"$tags" | grep -vx nosqlite | paste -sd, -)

src=$(mktemp -d "$cache/src.XXXXXX")
trap 'chmod -R u+w "$src" 2>/dev/null; rm -rf "$src"' EXIT
cp -r "$dir/." "$src"
chmod -R u+w "$src"
echo "juicefs.sh: building juicefs $ver (-tags $tags; cgo for sqlite3: several minutes)" >&2
log=$cache/juicefs-$ver.build.log
if ! (cd "$src" && CGO_ENABLED=1 go build -tags "$tags" -ldflags "-s -w" -o "$out.tmp" .) >"$log" 2>&1; then
	fail "go build failed (last lines of $log):
$(tail -n 20 "$log")"
fi
mv "$out.tmp" "$out"
"$out" --version >/dev/null 2>&1 || fail "the binary built, but $out --version fails"
echo "juicefs.sh: built $("$out" --version)" >&2
echo "$out"
