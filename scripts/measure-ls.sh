#!/usr/bin/env bash
# measure-ls.sh — cold ls -l of a namespace against a native directory of
# the same names, and the FUSE round trips the listing took:
#
#   sudo scripts/measure-ls.sh [N] [REPS]      # defaults: 100000 3
#   EXTRA=250000 scripts/measure-ls.sh         # on a store with more blobs
#
# N small files (distinct content) are put with the CLI into namespace
# "ls" of a fresh store; the native directory holds N files named by the
# same 64-hex digests, on the same filesystem ($MEASURE_DIR, default
# /var/tmp). Each repetition, interleaved: drop_caches and ls -l of the
# native directory; drop_caches, a fresh mount and ls -l of the namespace
# (cold), then a second ls -l (warm). Printed: every figure, medians of
# REPS, native ÷ mount, and the FUSE requests of the cold and warm
# listings by type (from the mount's /metrics: the count of its latency
# histogram). With BASE=BINARY, an older build's mount joins each
# repetition on the same store, so one run gives before and after.
set -euo pipefail

n=${1:-100000}
reps=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
PROG=measure-ls.sh
[[ $(id -u) == 0 ]] || { echo "$PROG: run as root (drop_caches, mount(2))" >&2; exit 1; }
work=$(mktemp -d "${MEASURE_DIR:-/var/tmp}/alkblobfs-ls.XXXXXX")
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	{ grep -o " $work/[^ ]*" /proc/self/mountinfo || true; } | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

bin=$work/alkblobfs
(cd "$root" && go build -o "$bin" ./cmd/alkblobfs)
systems=(after)
if [[ -n ${BASE:-} ]]; then
	cp "$BASE" "$work/alkblobfs-before"
	systems=(before after)
fi

# Sources: the native directory's file i holds "i\n" and is named by its
# sha256, the digest the namespace lists; the CLI puts those files.
mkdir -p "$work/native"
(cd "$work/native" && perl -MDigest::SHA=sha256_hex -e 'for my $i (1 .. $ARGV[0]) { my $c = "$i\n"; my $f = sha256_hex($c);
	open(my $o, ">", $f) or die "$f: $!"; print $o $c; close $o or die "$f: $!" }' "$n")
got=$(find "$work/native" -type f | wc -l)
[[ $got == "$n" ]] || { echo "$PROG: native directory has $got files, not $n" >&2; exit 1; }
data=$work/data
"$bin" --data "$data" ns create ls >/dev/null
(cd "$work/native" && find . -type f -printf '%f\n' | xargs -n 20000 "$bin" --data "$data" put --ns ls >/dev/null)
# EXTRA=M also puts M distinct 4 KiB blobs into another namespace: a store
# that holds more than the listed namespace, as make bench's store does by
# its listing rows.
if ((${EXTRA:-0} > 0)); then
	mkdir -p "$work/extra"
	head -c "$((EXTRA * 4096))" /dev/urandom | (cd "$work/extra" && split -b 4096 -a 7 - x)
	"$bin" --data "$data" ns create extra >/dev/null
	(cd "$work/extra" && find . -type f -printf '%f\n' | xargs -n 20000 "$bin" --data "$data" put --ns extra >/dev/null)
	rm -rf "$work/extra"
fi

# requests: the FUSE request counts of the mount's /metrics, "TYPE COUNT"
# per line.
requests() {
	curl -sS --unix-socket "$1" http://x/metrics |
		awk '/^alkblobfs_fuse_request_duration_seconds_count/ { match($0, /op="[^"]*"/); print substr($0, RSTART + 4, RLENGTH - 5), $2 }' | sort
}
# delta BEFORE AFTER: the requests between two snapshots, nonzero ones.
delta() {
	join -a 2 -e 0 -o 0,1.2,2.2 <(echo "$1") <(echo "$2") | awk '$3 - $2 > 0 { printf "%s=%d ", $1, $3 - $2 }'
}
# timels DIR [PID]: ls -l DIR; prints its wall seconds, then as $cpu the
# CPU seconds of ls (user + system) and, with PID, of that daemon.
timels() {
	local t0 t1 d0 d1
	[[ -n ${2:-} ]] && d0=$(proccpu "$2")
	t0=$(date +%s%N)
	/usr/bin/env time -f '%U %S' -o "$work/time" ls -l "$1" >"$work/out" 2>"$work/err" ||
		{ echo "$PROG: ls -l $1 failed:" >&2; cat "$work/err" >&2; exit 1; }
	t1=$(date +%s%N)
	[[ -n ${2:-} ]] && d1=$(proccpu "$2")
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", (b - a) / 1e9 }'
	awk -v d0="${d0:-0}" -v d1="${d1:-0}" '{ printf "ls %.2f daemon %.2f\n", $1 + $2, d1 - d0 }' "$work/time" >"$work/cpu"
}
# proccpu PID: utime + stime of PID in seconds.
proccpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%.2f\n", ($12 + $13) / hz }' "/proc/$1/stat"; }

declare -A fig
mount_ls() { # SYSTEM BINARY REP
	local mnt=$work/mnt-$1 sock=$work/$1.sock r0 r1 r2 t
	dropcaches
	mountfs "$2" "$mnt" --data "$data" mount --listen "unix:$sock"
	r0=$(requests "$sock")
	t=$(timels "$mnt/ls" "$(<"$mnt.pid")")
	[[ $(grep -c '^-' "$work/out") == "$n" ]] || { echo "$PROG: $1 listed $(grep -c '^-' "$work/out") files, not $n" >&2; exit 1; }
	fig[$1-cold]+=" $t"
	c=$(<"$work/cpu")
	r1=$(requests "$sock")
	t=$(timels "$mnt/ls" "$(<"$mnt.pid")")
	fig[$1-warm]+=" $t"
	r2=$(requests "$sock")
	echo "  rep $3 $1: cold ${fig[$1-cold]##* } s (CPU s: $c) [$(delta "$r0" "$r1")]"
	echo "  rep $3 $1: warm $t s (CPU s: $(<"$work/cpu")) [$(delta "$r1" "$r2")]"
	umountfs "$mnt"
}
native_ls() {
	local t
	dropcaches
	t=$(timels "$work/native")
	fig[native-cold]+=" $t"
	c=$(<"$work/cpu")
	t=$(timels "$work/native")
	fig[native-warm]+=" $t"
	echo "  rep $1 native: cold ${fig[native-cold]##* } s (CPU s: ${c% daemon*})  warm $t s (CPU s: $(awk '{print $1, $2}' "$work/cpu"))"
}

echo "== $n entries, $reps repetitions, interleaved ($(uname -r))"
for r in $(seq 1 "$reps"); do
	order=(native "${systems[@]}")
	for i in "${!order[@]}"; do
		s=${order[$(((i + r - 1) % ${#order[@]}))]}
		case $s in
		native) native_ls "$r" ;;
		after) mount_ls after "$bin" "$r" ;;
		before) mount_ls before "$work/alkblobfs-before" "$r" ;;
		esac
	done
done
med() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
for k in cold warm; do
	nm=$(med <<<"${fig[native-$k]}")
	line="$k: native $nm s"
	for s in "${systems[@]}"; do
		m=$(med <<<"${fig[$s-$k]}")
		line+="; $s $m s (native/$s $(awk -v a="$nm" -v b="$m" 'BEGIN { printf "%.2f", a / b }'))"
	done
	echo "$line"
done
