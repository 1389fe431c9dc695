#!/usr/bin/env bash
# measure-put-get.sh — `alkblobfs put` and `alkblobfs get -o` of one random
# file against `cp` of the same file, side by side in one run, plus the peak
# RSS of put at two sizes (it must not grow with the blob).
#
#   scripts/measure-put-get.sh [SIZE_MIB] [REPS]      # defaults: 1024 3
#
# The store is the embedded default (sqlite kv + local large tier) under a
# fresh --data directory in $TMPDIR (default /tmp), so store, source file and
# cp's target share one filesystem. Each repetition puts into a new store
# (a re-put would dedup and write nothing). Times are medians of REPS runs
# with a warm page cache for the source (nothing here drops caches). put and
# get -o fsync what they write; plain cp does not, so the table also shows
# cp followed by `sync FILE` (an fsync of the copy).
#
# Ratios are throughput relative to the native command: time(cp) /
# time(alkblobfs), so 1.0 is as fast as cp and 0.5 half as fast.
set -euo pipefail

size_mib=${1:-1024}
reps=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
TIME=/usr/bin/time
if [[ ! -x $TIME ]]; then
	echo "measure-put-get: $TIME is missing (Debian package 'time')" >&2
	exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/alkblobfs-measure.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
bin=$work/alkblobfs
(cd "$root" && go build -o "$bin" ./cmd/alkblobfs)

src=$work/src.bin
head -c "$((size_mib << 20))" /dev/urandom >"$src"

# timed CMD... runs CMD under /usr/bin/time and prints "SECONDS MAXRSS_KIB".
timed() {
	local out=$work/time.out
	"$TIME" -f '%e %M' -o "$out" "$@" >/dev/null
	cat "$out"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

declare -a t_cp t_cpsync t_put t_get rss_put rss_get
for ((i = 1; i <= reps; i++)); do
	rm -f "$work/cp.bin"
	read -r s _ < <(timed cp "$src" "$work/cp.bin")
	t_cp+=("$s")
	rm -f "$work/cp.bin"
	read -r s _ < <(timed sh -c 'cp "$1" "$2" && sync "$2"' sh "$src" "$work/cp.bin")
	t_cpsync+=("$s")
	rm -f "$work/cp.bin"

	data=$work/data-$i
	read -r s kib < <(timed "$bin" --data "$data" put "$src")
	t_put+=("$s")
	rss_put+=("$kib")
	d=$(sha256sum "$src" | cut -c1-64)
	read -r s kib < <(timed "$bin" --data "$data" get "$d" -o "$work/out.bin")
	t_get+=("$s")
	rss_get+=("$kib")
	cmp -s "$src" "$work/out.bin" || { echo "get -o returned different bytes" >&2; exit 1; }
	rm -f "$work/out.bin"
	chmod -R u+w "$data"
	rm -rf "$data"
done

m_cp=$(printf '%s\n' "${t_cp[@]}" | median)
m_cpsync=$(printf '%s\n' "${t_cpsync[@]}" | median)
m_put=$(printf '%s\n' "${t_put[@]}" | median)
m_get=$(printf '%s\n' "${t_get[@]}" | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "inf" }'; }
mibs() { awk -v n="$size_mib" -v t="$1" 'BEGIN { if (t > 0) printf "%.0f", n / t; else print "inf" }'; }

echo "# put/get of $size_mib MiB vs cp, median of $reps, $(nproc) CPUs, ${TMPDIR:-/tmp}$(df -P "$work" | awk 'NR == 2 { print " on " $1 }')"
printf '%-22s %8s %9s %12s %14s\n' command seconds "MiB/s" "vs cp" "vs cp+fsync"
printf '%-22s %8s %9s %12s %14s\n' "cp" "$m_cp" "$(mibs "$m_cp")" 1.00 -
printf '%-22s %8s %9s %12s %14s\n' "cp + sync FILE" "$m_cpsync" "$(mibs "$m_cpsync")" "$(ratio "$m_cp" "$m_cpsync")" 1.00
printf '%-22s %8s %9s %12s %14s\n' "alkblobfs put" "$m_put" "$(mibs "$m_put")" "$(ratio "$m_cp" "$m_put")" "$(ratio "$m_cpsync" "$m_put")"
printf '%-22s %8s %9s %12s %14s\n' "alkblobfs get -o" "$m_get" "$(mibs "$m_get")" "$(ratio "$m_cp" "$m_get")" "$(ratio "$m_cpsync" "$m_get")"
echo "all runs (s): cp ${t_cp[*]} | cp+sync ${t_cpsync[*]} | put ${t_put[*]} | get ${t_get[*]}"
echo "peak RSS (KiB) at $size_mib MiB: put ${rss_put[*]} | get -o ${rss_get[*]}"

# Peak RSS of put at a tenth of the size (100 MiB by default): it must not
# grow with the blob.
small_mib=$((size_mib / 10 > 0 ? size_mib / 10 : 1))
head -c "$((small_mib << 20))" /dev/urandom >"$work/small.bin"
read -r _ kib_small < <(timed "$bin" --data "$work/data-small" put "$work/small.bin")
echo "peak RSS of put: ${kib_small} KiB at $small_mib MiB, ${rss_put[0]} KiB at $size_mib MiB"
