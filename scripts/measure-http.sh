#!/usr/bin/env bash
# measure-http.sh — the HTTP surface against a plain net/http server that
# discards what it is sent, side by side in one run:
#
#   scripts/measure-http.sh [SIZE_MIB] [REPS] [PUTS]    # defaults: 1024 3 10000
#
# 1. A SIZE_MIB random file uploaded with curl -T (streamed): to the discard
#    server, and to `alkblobfs serve` (embedded default store, a fresh one
#    per upload so that nothing dedups); beside them the disk's floors in
#    the same directory: `cp` of the file and `sync` of the copy, `dd` of
#    zeros with conv=fsync (the floor for a durable put of that size), and
#    `dd` without it (the page cache alone). Each step starts after a
#    `sync`, in an order rotated per repetition; medians of REPS.
# 2. PUTS puts of distinct 1 KiB blobs over keep-alive connections, 8 at a
#    time (scripts/httpbench), against both servers, then PUTS gets of one
#    1 KiB blob against alkblobfs.
#    Part 2 runs REPS times, interleaved with the discard server's puts,
#    each on a fresh store; it prints medians, the ratio to discard, the
#    server's CPU per put (utime + stime over the puts) and its I/O per
#    put (/proc/PID/io: read and write syscalls, bytes through them).
# SIZE_MIB 0 skips part 1. With BASE=BINARY, both parts also run BINARY (an
# older build: the "before") beside this tree's build (the "after"),
# interleaved, each on a fresh store, and print both. With PROFILE=DIR,
# part 2's servers of this tree write a CPU profile and a heap profile
# (go tool pprof -sample_index=alloc_objects) per run into DIR.
# alkblobfs serve listens on loopback TCP with a token file (every request
# carries its bearer token and is authorised); a BASE binary that predates
# token files gets none. The stores live in $TMPDIR (default /tmp).
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

token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s %s\n' "$token" "$(id -u)" >"$work/tokens"
chmod 600 "$work/tokens"

# start_serve DATA [BINARY [ARGS...]]: runs alkblobfs serve on a free port,
# with ARGS added; sets url and pid.
start_serve() {
	local data=$1 bin=${2:-$work/alkblobfs} auth=()
	shift $(($# < 2 ? $# : 2))
	mkdir -p "$data" && chmod 700 "$data"
	"$bin" --data "$data" ns create bench
	if [[ $("$bin" serve --help) == *--insecure-loopback* ]]; then
		auth=(--auth-token-file "$work/tokens")
	fi
	"$bin" --data "$data" serve --listen 127.0.0.1:0 "${auth[@]}" "$@" 2>"$data.log" &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 100); do
		url=$(grep -o 'url=http://[0-9.:]*' "$data.log" | head -n 1 | cut -d= -f2-) || true
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
	curl -sS -o /dev/null --fail -X POST -H 'Content-Type: application/octet-stream' -H "Authorization: Bearer $token" -T "$work/blob" "$1" || {
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

# cpusecs PID: the process's user + system CPU seconds.
cpusecs() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%.2f\n", ($12 + $13) / hz }' "/proc/$1/stat"; }

# ddfloor [conv=fsync]: seconds of dd writing SIZE_MIB of zeros into the
# stores' directory, with its fsync or without.
ddfloor() {
	local t0 t1
	t0=$(date +%s%N)
	dd if=/dev/zero of="$work/dd" bs=1M count="$size_mib" status=none "$@"
	t1=$(date +%s%N)
	rm -f "$work/dd"
	echo "scale=3; ($t1 - $t0) / 1000000000" | bc
}

# upalk BINARY LABEL R: the upload to a fresh alkblobfs serve of BINARY;
# appends its seconds to up_LABEL and the server's CPU seconds over it to
# upcpu_LABEL.
upalk() {
	local c0 t
	start_serve "$work/store-$2-$3" "$1"
	sync
	c0=$(cpusecs "$pid")
	t=$(upload "$url/v1/blobs?namespace=bench")
	eval "up_$2+=(\"$t\")"
	eval "upcpu_$2+=(\"$(awk -v a="$c0" -v b="$(cpusecs "$pid")" 'BEGIN { printf "%.2f", b - a }')\")"
	kill "$pid"; wait "$pid" 2>/dev/null || true
	rm -rf "$work/store-$2-$3"
}

# ratio A B: A / B to two places.
ratio() { echo "scale=2; $1 / $2" | bc; }

if ((size_mib > 0)); then
declare -a up_discard up_after up_before up_cp up_dd up_ddnf upcpu_after upcpu_before
steps=(discard after cp dd ddnf)
[[ -n ${BASE:-} ]] && steps+=(before)
for r in $(seq "$reps"); do
	for ((i = 0; i < ${#steps[@]}; i++)); do
		sync
		case ${steps[(i + r) % ${#steps[@]}]} in
		discard) up_discard+=("$(upload "http://$discard/")") ;;
		after) upalk "$work/alkblobfs" after "$r" ;;
		before) upalk "$BASE" before "$r" ;;
		cp) up_cp+=("$(copysync)") ;;
		dd) up_dd+=("$(ddfloor conv=fsync)") ;;
		ddnf) up_ddnf+=("$(ddfloor)") ;;
		esac
	done
done
mn=$(printf '%s\n' "${up_discard[@]}" | median)
ma=$(printf '%s\n' "${up_after[@]}" | median)
mc=$(printf '%s\n' "${up_cp[@]}" | median)
md=$(printf '%s\n' "${up_dd[@]}" | median)
mf=$(printf '%s\n' "${up_ddnf[@]}" | median)
mbs() { echo "scale=0; $size_mib * 1.048576 / $1" | bc; }
echo "one $size_mib MiB file, medians of $reps (s): curl→discard ${up_discard[*]} → $mn; curl→alkblobfs ${up_after[*]} → $ma"
echo "  disk floors: cp+sync ${up_cp[*]} → $mc; dd conv=fsync ${up_dd[*]} → $md; dd without fsync ${up_ddnf[*]} → $mf"
echo "  MB/s: curl→discard $(mbs "$mn"), curl→alkblobfs $(mbs "$ma"), cp+sync $(mbs "$mc"), dd fsync $(mbs "$md"), dd $(mbs "$mf")"
echo "  server CPU over the upload (s): ${upcpu_after[*]} → $(printf '%s\n' "${upcpu_after[@]}" | median)"
echo "  ratios: alkblobfs/discard $(ratio "$mn" "$ma"), alkblobfs/(cp+sync) $(ratio "$mc" "$ma"), alkblobfs/(dd fsync) $(ratio "$md" "$ma"); the most a durable put could reach, (dd fsync)/discard: $(ratio "$mn" "$md")"
if [[ -n ${BASE:-} ]]; then
	mb=$(printf '%s\n' "${up_before[@]}" | median)
	echo "  before (BASE): ${up_before[*]} → $mb s, ratio to discard $(ratio "$mn" "$mb"); server CPU ${upcpu_before[*]} → $(printf '%s\n' "${upcpu_before[@]}" | median) s"
fi
fi

# rate LINE: the per-second figure of an httpbench line.
rate() { awk '{for (i = 1; i < NF; i++) if ($(i + 1) ~ /\/s,$/) print $i}' <<<"$1"; }

# iosnap PID: the process's rchar wchar syscr syscw (/proc/PID/io).
iosnap() { awk '/^(rchar|wchar|syscr|syscw):/ {printf "%s ", $2}' "/proc/$1/io"; }

# bench BINARY LABEL: puts then gets against a fresh store; appends the
# rates to puts_LABEL and gets_LABEL, the server's CPU per put (µs) to
# cpu_LABEL and its I/O per put to io_LABEL. With PROFILE, a server of
# this tree's build writes its profiles there.
bench() {
	local bin=$1 label=$2 p g d c0 c1 i0 prof=()
	if [[ -n ${PROFILE:-} && $bin == "$work/alkblobfs" ]]; then
		runs=$((${runs:-0} + 1))
		mkdir -p "$PROFILE"
		prof=(--cpuprofile "$PROFILE/$label-$runs.cpu" --memprofile "$PROFILE/$label-$runs.mem")
	fi
	start_serve "$work/bench-$label" "$bin" "${prof[@]}"
	c0=$(cpusecs "$pid")
	i0=$(iosnap "$pid")
	p=$("$work/httpbench" puts -url "$url/v1/blobs?namespace=bench" -n "$nputs" -token "$token")
	c1=$(cpusecs "$pid")
	eval "io_$label+=(\"$(awk -v n="$nputs" '{ printf "%.1f/%.1f/%.0f/%.0f", ($7 - $3) / n, ($8 - $4) / n, ($5 - $1) / n, ($6 - $2) / n }' <<<"$i0 $(iosnap "$pid")")\")"
	eval "cpu_$label+=(\"$(awk -v a="$c0" -v b="$c1" -v n="$nputs" 'BEGIN { printf "%.0f", (b - a) * 1e6 / n }')\")"
	d=$(head -c 1024 /dev/urandom | tee "$work/one" | curl -sS --fail -H "Authorization: Bearer $token" --data-binary @- "$url/v1/blobs?namespace=bench" | grep -o '"digest":"[0-9a-f]*"' | cut -d'"' -f4)
	g=$("$work/httpbench" gets -url "$url/v1/blobs/$d?namespace=bench" -n "$nputs" -token "$token")
	kill "$pid"; wait "$pid" 2>/dev/null || true
	rm -rf "$work/bench-$label"
	eval "puts_$label+=(\"$(rate "$p")\")"
	eval "gets_$label+=(\"$(rate "$g")\")"
}

# ioline RUNS…: prints the per-put I/O of each run, read/write syscalls and
# bytes read/written through them.
ioline() { echo "  server I/O per put (read syscalls/write syscalls/bytes read/bytes written): $*"; }

# discardputs: PUTS puts against the discard server; appends the rate to
# puts_discard.
discardputs() { puts_discard+=("$(rate "$("$work/httpbench" puts -url "http://$discard/" -n "$nputs")")"); }

if [[ -n ${BASE:-} ]]; then
	declare -a puts_before puts_after gets_before gets_after cpu_before cpu_after io_before io_after puts_discard
	for r in $(seq "$reps"); do
		case $((r % 3)) in
		1) discardputs; bench "$BASE" before; bench "$work/alkblobfs" after ;;
		2) bench "$work/alkblobfs" after; discardputs; bench "$BASE" before ;;
		0) bench "$BASE" before; bench "$work/alkblobfs" after; discardputs ;;
		esac
	done
	md=$(printf '%s\n' "${puts_discard[@]}" | median)
	mb=$(printf '%s\n' "${puts_before[@]}" | median)
	ma=$(printf '%s\n' "${puts_after[@]}" | median)
	echo "1 KiB puts/s, $reps runs interleaved: discard ${puts_discard[*]} → $md; before ${puts_before[*]} → $mb; after ${puts_after[*]} → $ma"
	echo "  ratios to discard: before $(echo "scale=3; $mb / $md" | bc), after $(echo "scale=3; $ma / $md" | bc)"
	echo "  server CPU per put (µs): before ${cpu_before[*]} → $(printf '%s\n' "${cpu_before[@]}" | median); after ${cpu_after[*]} → $(printf '%s\n' "${cpu_after[@]}" | median)"
	ioline "before ${io_before[*]}; after ${io_after[*]}"
	echo "1 KiB gets/s, $reps runs interleaved: before ${gets_before[*]} → $(printf '%s\n' "${gets_before[@]}" | median); after ${gets_after[*]} → $(printf '%s\n' "${gets_after[@]}" | median)"
	exit 0
fi

declare -a puts_discard puts_now cpu_now io_now gets_now
for r in $(seq "$reps"); do
	if ((r % 2)); then discardputs; bench "$work/alkblobfs" now
	else bench "$work/alkblobfs" now; discardputs; fi
done
md=$(printf '%s\n' "${puts_discard[@]}" | median)
ma=$(printf '%s\n' "${puts_now[@]}" | median)
echo "1 KiB puts/s, $reps runs interleaved: discard ${puts_discard[*]} → $md; alkblobfs ${puts_now[*]} → $ma (ratio $(echo "scale=3; $ma / $md" | bc))"
echo "  server CPU per put (µs): ${cpu_now[*]} → $(printf '%s\n' "${cpu_now[@]}" | median)"
ioline "${io_now[*]}"
echo "1 KiB gets/s: ${gets_now[*]} → $(printf '%s\n' "${gets_now[@]}" | median)"
