#!/usr/bin/env bash
# release.sh X.Y.Z (make release VERSION=X.Y.Z) releases what CHANGELOG.md's
# ## [Unreleased] section lists as X.Y.Z: it checks that the tree is clean,
# that X.Y.Z is a version newer than the last release and not tagged yet,
# and that the section lists something; renames the section to
# ## [X.Y.Z] - <today, UTC> under a new empty ## [Unreleased]; commits
# CHANGELOG.md and tags vX.Y.Z (annotated). Nothing is pushed.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
	echo "release: $*" >&2
	exit 1
}

v=${1:-}
[[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "VERSION=$v: want X.Y.Z (make release VERSION=0.2.0)"
[[ -z $(git status --porcelain --untracked-files=no) ]] || die "the tree has uncommitted changes: commit them first"
! git rev-parse -q --verify "refs/tags/v$v" >/dev/null || die "tag v$v exists already"

last=$(grep -m1 -oE '^## \[[0-9]+\.[0-9]+\.[0-9]+\] - ' CHANGELOG.md | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' || true)
if [[ -n $last ]] && [[ $(printf '%s\n%s\n' "$last" "$v" | sort -V | tail -n1) != "$v" || $last == "$v" ]]; then
	die "$v is not newer than the last release in CHANGELOG.md, $last"
fi
grep -q '^## \[Unreleased\]$' CHANGELOG.md || die "CHANGELOG.md has no ## [Unreleased] section to release"
# The section's entries: its lines up to the next ## heading.
items=$(awk '/^## \[Unreleased\]$/ {sec=1; next} /^## / {sec=0} sec && /^- /' CHANGELOG.md)
[[ -n $items ]] || die "CHANGELOG.md's ## [Unreleased] section lists nothing to release"

today=$(date -u +%Y-%m-%d)
awk -v v="$v" -v d="$today" '/^## \[Unreleased\]$/ && !done {print; print ""; print "## [" v "] - " d; done=1; next} {print}' \
	CHANGELOG.md >CHANGELOG.md.new
mv CHANGELOG.md.new CHANGELOG.md
git commit -q -m "release $v" -- CHANGELOG.md
git tag -a "v$v" -m "alkblobfs $v"
echo "release: committed and tagged v$v ($(git rev-parse --short HEAD)); push the commit and the tag to publish it"
