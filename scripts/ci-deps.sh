#!/usr/bin/env bash
# ci-deps.sh installs the Debian packages that the test suite calls:
# rsync, fuse3, attr, bindfs, psmisc, man-db (the man page test), bash-completion, strace (counts the xattr calls of ls -l), e2fsprogs (mkfs.ext4 and filefrag, for
# the loop-mounted filesystems of the bit-rot and power-loss tests, with
# util-linux's mount and losetup), lintian and dpkg-dev (dpkg-shlibdeps) for
# the package test, prometheus (the server and promtool, for the alert
# rules and the dashboard) and the PostgreSQL server binaries.
#
# Idempotent: each package is checked by a command it provides, and apt-get
# (update included) runs only when something is missing. Needs root (or
# sudo) only in that case.
set -euo pipefail

need=()

# want COMMAND PACKAGE: PACKAGE is needed unless COMMAND is on PATH.
want() {
	command -v "$1" >/dev/null 2>&1 || need+=("$2")
}

want rsync rsync
want fusermount3 fuse3
want getfattr attr
want bindfs bindfs
want fuser psmisc
want man man-db
want strace strace
want mkfs.ext4 e2fsprogs
want filefrag e2fsprogs
want losetup mount
want curl curl
want python3 python3 # TestWrongDigestPutByPath: what Python gets from a failed close()
want lintian lintian                # TestDebPackage
want dpkg-shlibdeps dpkg-dev        # make deb: the package's libc dependency
want prometheus prometheus          # TestPrometheusRules, TestPrometheusScrape
want promtool prometheus
# The package test (TestDebPackage) completes through bash-completion, which
# is what loads /usr/share/bash-completion/completions; it has no command.
[[ -f /usr/share/bash-completion/bash_completion ]] || need+=(bash-completion)

# Debian keeps the server binaries off PATH, in /usr/lib/postgresql/N/bin.
pg_bindir() {
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
	[[ -n $d && -x $d/initdb ]] && echo "$d"
}
if ! command -v initdb >/dev/null 2>&1 && ! pg_bindir >/dev/null; then
	need+=(postgresql)
fi

# as_root runs a command as root: directly, or through sudo.
as_root() {
	if [[ $(id -u) == 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo "$@"
	else
		echo "ci-deps: need root (or sudo) to run: $*" >&2
		exit 1
	fi
}

if ((${#need[@]} > 0)); then
	echo "ci-deps: installing ${need[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# Put initdb, pg_ctl and postgres on PATH, as test scripts look them up with
# command -v.
if ! command -v initdb >/dev/null 2>&1; then
	bindir=$(pg_bindir) || { echo "ci-deps: no initdb after installing postgresql" >&2; exit 1; }
	for b in initdb pg_ctl postgres; do
		as_root ln -sf "$bindir/$b" "/usr/local/bin/$b"
	done
	echo "ci-deps: linked $bindir/{initdb,pg_ctl,postgres} into /usr/local/bin"
fi

# The S3 server the tests run against (versitygw), built with go install
# the first time.
"$(dirname "$0")/s3.sh" --install

echo "ci-deps: ok"
