#!/usr/bin/env bash
# measure-http.sh — the HTTP surface against a plain net/http server that
# discards what it is sent, side by side in one run:
#
#   scripts/measure-http.sh [SIZE_MIB] [REPS] [PUTS]    # defaults: 1024 3 10000
#
# 1. A SIZE_MIB random file uploaded with curl -T (streamed): to the discard
#    server, and to `alkblobfs serve` (embedded default store, a fresh one
#    per repetition so that nothing dedups); beside them `cp` of the file
#    and `sync` of the copy, the disk's floor for a durable put.
#    Interleaved, medians of REPS.
# 2. PUTS puts of distinct 1 KiB blobs over keep-alive connections, 8 at a
#    time (scripts/httpbench), against both servers.
# Everything listens on loopback; the stores live in $TMPDIR (default /tmp).
set -euo pipefail

size_mib=${1:-1024}
reps=${2:-3}
nputs=${3:-10000}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/alkblobfs-http.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

(cd "$root" && go build -o "$work/alkblobfs" ./cmd/alkblobfs && go build -o "$work/httpbench" ./scripts/httpbench)
command -v curl >/dev/null || { echo "measure-http: curl is missing" >&2; exit 1; }

# start_serve DATA: runs alkblobfs serve on a free port; sets url and pid.
start_serve() {
	local data=$1
	mkdir -p "$data" && chmod 700 "$data"
	"$work/alkblobfs" --data "$data" ns create bench
	"$work/alkblobfs" --data "$data" serve --listen 127.0.0.1:0 2>"$data.log" &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 100); do
		url=$(grep -o 'url=http://[0-9.:]*' "$data.log" | head -n 1 | cut -d= -f2) || true
		[[ -n $url ]] && return
		sleep 0.05
	done
	echo "measure-http: serve did not start" >&2
	cat "$data.log" >&2
	exit 1
}

"$work/httpbench" discard -listen 127.0.0.1:0 >"$work/discard.log" &
pids+=("$!")
for _ in $(seq 100); do
	discard=$(awk '/listening/ {print $2}' "$work/discard.log")
	[[ -n $discard && $discard != *:0 ]] && break
	sleep 0.05
done
head -c $((size_mib << 20)) /dev/urandom >"$work/blob"

upload() { # URL → seconds
	local t0 t1
	t0=$(date +%s%N)
	# -T streams the file (--data-binary would read it all into memory).
	curl -sS -o /dev/null --fail -X POST -H 'Content-Type: application/octet-stream' -T "$work/blob" "$1" || {
		echo "measure-http: upload to $1 failed" >&2
		kill $$
	}
	t1=$(date +%s%N)
	echo "scale=3; ($t1 - $t0) / 1000000000" | bc
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

copysync() { # → seconds of cp + sync of the copy
	local t0 t1
	t0=$(date +%s%N)
	cp "$work/blob" "$work/copy" && sync "$work/copy"
	t1=$(date +%s%N)
	rm -f "$work/copy"
	echo "scale=3; ($t1 - $t0) / 1000000000" | bc
}

declare -a tn ta tc
for r in $(seq "$reps"); do
	start_serve "$work/store$r"
	sync
	case $((r % 3)) in
	1)
		tn+=("$(upload "http://$discard/")")
		ta+=("$(upload "$url/v1/blobs?namespace=bench")")
		tc+=("$(copysync)")
		;;
	2)
		ta+=("$(upload "$url/v1/blobs?namespace=bench")")
		tc+=("$(copysync)")
		tn+=("$(upload "http://$discard/")")
		;;
	0)
		tc+=("$(copysync)")
		tn+=("$(upload "http://$discard/")")
		ta+=("$(upload "$url/v1/blobs?namespace=bench")")
		;;
	esac
	kill "$pid"; wait "$pid" 2>/dev/null || true
	rm -rf "$work/store$r"
done
mn=$(printf '%s\n' "${tn[@]}" | median)
ma=$(printf '%s\n' "${ta[@]}" | median)
mc=$(printf '%s\n' "${tc[@]}" | median)
mbs() { echo "scale=0; $size_mib * 1.048576 / $1" | bc; }
echo "one $size_mib MiB file, medians of $reps (s): curl→discard ${tn[*]} → $mn; curl→alkblobfs ${ta[*]} → $ma; cp+sync ${tc[*]} → $mc"
echo "  MB/s: curl→discard $(mbs "$mn"), curl→alkblobfs $(mbs "$ma"), cp+sync $(mbs "$mc")"
echo "  ratios: alkblobfs/discard $(echo "scale=2; $mn / $ma" | bc), alkblobfs/(cp+sync) $(echo "scale=2; $mc / $ma" | bc)"

start_serve "$work/puts"
echo "discard:   $("$work/httpbench" puts -url "http://$discard/" -n "$nputs")"
echo "alkblobfs: $("$work/httpbench" puts -url "$url/v1/blobs?namespace=bench" -n "$nputs")"
