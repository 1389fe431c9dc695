#!/usr/bin/env bash
# shlibdeps.sh BINARY prints the Depends: a Debian package needs for the
# shared libraries BINARY links (libc6 (>= 2.34), say), computed as
# Debian computes it: by dpkg-shlibdeps, from the symbols files of the
# installed libraries. dpkg-shlibdeps wants a debian/ directory with a
# control file and the binary under debian/PACKAGE/ (beside DEBIAN/): it gets a temporary
# one. A static binary prints nothing.
set -euo pipefail
bin=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debian/alkblobfs/usr/bin" "$tmp/debian/alkblobfs/DEBIAN"
printf "Source: alkblobfs\n\nPackage: alkblobfs\nArchitecture: any\n" >"$tmp/debian/control"
cp "$bin" "$tmp/debian/alkblobfs/usr/bin/alkblobfs"
cd "$tmp"
out=$(dpkg-shlibdeps -O debian/alkblobfs/usr/bin/alkblobfs)
echo "${out#shlibs:Depends=}"
