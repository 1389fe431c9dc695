#!/usr/bin/env bash
# version.sh prints the version of the source tree it is in, which every
# build carries (make build's -X main.version, the man pages, the Debian
# package): CHANGELOG.md's newest released entry (## [X.Y.Z] - DATE), since
# a clone may carry no tags and the repository itself must say it. A build
# of any other commit than that release's appends +g<short commit> (Debian
# orders 0.1.0 < 0.1.0+g33b8a33 < 0.1.1), and a modified tree +dirty.
# The release's commit is the one tagged vX.Y.Z or, without the tag, the
# one that wrote the entry's heading (make release does both). Outside a
# git checkout (an exported tree) the entry alone.
set -euo pipefail
cd "$(dirname "$0")/.."

heading=$(grep -m1 -E '^## \[[0-9]+\.[0-9]+\.[0-9]+\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$' CHANGELOG.md || true)
if [[ -z $heading ]]; then
	echo "version.sh: CHANGELOG.md has no released entry (## [X.Y.Z] - YYYY-MM-DD)" >&2
	exit 1
fi
v=${heading#'## ['}
v=${v%%]*}
if ! git rev-parse --git-dir >/dev/null 2>&1; then
	echo "$v"
	exit 0
fi

head=$(git rev-parse HEAD)
rel=$(git rev-parse -q --verify "refs/tags/v$v^{commit}" 2>/dev/null ||
	git log -1 --format=%H -S"$heading" -- CHANGELOG.md)
dirty=
if [[ -n $(git status --porcelain --untracked-files=no) ]]; then
	dirty=+dirty
fi
if [[ $head == "$rel" ]]; then
	echo "$v$dirty"
else
	echo "$v+g$(git rev-parse --short=7 HEAD)$dirty"
fi
