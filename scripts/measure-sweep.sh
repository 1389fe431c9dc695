#!/usr/bin/env bash
# measure-sweep.sh — duration and peak RSS of `alkblobfs sweep` over a pool
# of N entries on the default store (SQLite kv + local large tier), a
# fraction of them linked in a namespace.
#
#   scripts/measure-sweep.sh [N] [LINK_FRACTION]      # defaults: 1000000 0.1
#
# scripts/mkpool creates the N tiny blobs and the links. With SQLite the
# delete window is durable, so the first sweep marks and stages the
# unlinked blobs and the second deletes them; both are timed with
# /usr/bin/time (elapsed seconds and peak RSS). The sweep's own report
# (duration_ns, counts) is printed too, then the store is checked: exactly
# the linked blobs remain.
set -euo pipefail

n=${1:-1000000}
frac=${2:-0.1}
root=$(cd "$(dirname "$0")/.." && pwd)
TIME=/usr/bin/time
for tool in "$TIME" jq; do
	command -v "$tool" >/dev/null || { echo "measure-sweep: $tool is missing" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/alkblobfs-sweep.XXXXXX")
trap 'rm -rf "$work"' EXIT
bin=$work/alkblobfs
(cd "$root" && go build -o "$bin" ./cmd/alkblobfs && go build -o "$work/mkpool" ./scripts/mkpool)
data=$work/data

"$work/mkpool" -data "$data" -n "$n" -link "$frac" -ns keep
linked=$("$bin" --data "$data" ns ls -l | awk '$1 == "keep" { print $2 }')

echo "# sweep over $n entries ($linked linked), $(nproc) CPUs, sqlite+local under ${TMPDIR:-/tmp}"
printf '%-8s %9s %13s %8s %8s %8s %11s\n' sweep "wall (s)" "peak RSS MiB" scanned staged deleted "report (s)"
for i in 1 2; do
	"$TIME" -f '%e %M' -o "$work/time.out" "$bin" --data "$data" sweep --json >"$work/rep.json"
	read -r secs kib <"$work/time.out"
	jq -r --arg i "$i" --arg s "$secs" --arg m "$(awk -v k="$kib" 'BEGIN { printf "%.1f", k / 1024 }')" \
		'[$i, $s, $m, .scanned, .candidates_staged, .deleted, (.duration_ns / 1e9 * 1000 | round / 1000)] | @tsv' "$work/rep.json" |
		awk -F'\t' '{ printf "%-8s %9s %13s %8s %8s %8s %11s\n", $1, $2, $3, $4, $5, $6, $7 }'
done

left=$("$bin" --data "$data" ls | wc -l)
inns=$("$bin" --data "$data" ls keep | wc -l)
echo "after two sweeps: $left blobs in the pool, $inns linked in keep"
[[ $left == "$linked" && $inns == "$linked" ]] || { echo "measure-sweep: expected exactly the $linked linked blobs to remain" >&2; exit 1; }
