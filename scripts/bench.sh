#!/usr/bin/env bash
# bench.sh — the mount against the same work done natively, and against
# bindfs over the same directory (a FUSE peer), side by side in one run.
# Every workload runs BENCH_REPS times (default 3), interleaved across the
# systems (native, bindfs, each alkblobfs mode, then again), with the page
# cache dropped before every cold run; the table gives the median, min and
# max of each, and the ratio of medians native ÷ system (1.0 is native
# speed, higher is better). A FUSE system measured more than 10% faster
# than native is flagged SUSPECT: its baseline is wrong.
#
#   read   dd of a 1 GiB blob: its backing file (native), bindfs over the
#          blob directory, and mounts with --verify=full, full without
#          passthrough, strict and publish; cold (caches dropped, fresh
#          mount) and warm (the third read)
#   write  cp of a 1 GiB file (distinct content each repetition) into
#          incoming/, against cp + sync natively and into bindfs: the
#          mount fsyncs at publish
#   small  cp -r of 10 000 files of 4 KiB (distinct each repetition), each
#          side followed by sync
#   ls     ls -l of a namespace with 100 000 entries (put with the CLI
#          beforehand) against a native directory of as many files, and
#          bindfs over it; cold and warm (the second listing)
#
#   sudo scripts/bench.sh                    # as root: drop_caches, mount(2)
#   BENCH_SIZE_MB=256 BENCH_SMALL=2000 BENCH_LS=20000 BENCH_REPS=3 scripts/bench.sh   # quick
#   BENCH_PROFILE=/tmp/prof scripts/bench.sh # CPU profiles of the daemon's
#                                            # read and write runs (go tool pprof)
#
# Work happens in $BENCH_DIR (default /var/tmp), so store, sources and the
# native targets share one filesystem. The table is also written as JSON
# (every repetition's figure) to $BENCH_JSON (default bench-results.json in
# the current directory). JuiceFS, another FUSE peer, is not run: it is not
# packaged for this machine's registries.
set -euo pipefail

size_mb=${BENCH_SIZE_MB:-1024}
small_n=${BENCH_SMALL:-10000}
ls_n=${BENCH_LS:-100000}
reps=${BENCH_REPS:-3}
profile=${BENCH_PROFILE:-}
json=${BENCH_JSON:-bench-results.json}
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ $(id -u) != 0 ]]; then
	echo "bench.sh: run as root (drop_caches, mount(2), FUSE passthrough)" >&2
	exit 1
fi
for c in bindfs getfattr fusermount3; do
	command -v "$c" >/dev/null || { echo "bench.sh: $c missing (scripts/ci-deps.sh installs it)" >&2; exit 1; }
done

work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/alkblobfs-bench.XXXXXX")
PROG=bench.sh
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"
binds=()
cleanup() {
	for m in "${binds[@]}"; do fusermount3 -uz "$m" 2>/dev/null || true; done
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	{ grep -o " $work/[^ ]*" /proc/self/mountinfo || true; } | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	chmod -R u+w "$work" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
bin=$work/alkblobfs
(cd "$root" && go build -o "$bin" ./cmd/alkblobfs)
[[ -n $profile ]] && mkdir -p "$profile"

results=$work/results
bindmount() {
	mkdir -p "$2"
	bindfs "$1" "$2"
	binds+=("$2")
}

data=$work/data
mnt=$work/mnt
native=$work/native
mkdir -p "$native"

echo "== sources ($size_mb MiB to read, $size_mb MiB x $reps to write, $small_n x 4 KiB x $reps, $ls_n tiny files)"
head -c "$((size_mb << 20))" /dev/urandom >"$work/read.bin"
head -c "$((size_mb << 20))" /dev/urandom >"$work/write.bin"
for r in $(seq 1 "$reps"); do
	cp "$work/write.bin" "$work/write-$r.bin"
	printf 'repetition %d' "$r" | dd of="$work/write-$r.bin" conv=notrunc status=none
	mkdir -p "$work/small-$r"
	head -c "$((small_n * 4096))" /dev/urandom | split -b 4096 -a 6 - "$work/small-$r/f"
done
mkdir -p "$work/lsdir"
seq -w 1 "$ls_n" | (cd "$work/lsdir" && split -l 1 -a 6 - f)

echo "== the blob to read, and the namespace to list"
"$bin" --data "$data" ns create bench >/dev/null
"$bin" --data "$data" ns create ls >/dev/null
digest=$("$bin" --data "$data" put --ns bench "$work/read.bin")
(cd "$work/lsdir" && ls | xargs -n 20000 "$bin" --data "$data" put --ns ls >/dev/null)
backing=$data/large/blobs/${digest:0:2}/$digest
[[ -f $backing ]] || { echo "bench.sh: no backing file $backing" >&2; exit 1; }
bindmount "$data/large/blobs" "$work/bindr"
bindmount "$work/lsdir" "$work/bindls"
mkdir -p "$native/b"
bindmount "$native/b" "$work/bindw"

# reads SYSTEM FILE: cold, second and warm (third) reads of FILE.
reads() {
	dropcaches
	rec "read $size_mb MiB, cold" "$1" "$(secs ddread "$2")"
	secs ddread "$2" >/dev/null
	rec "read $size_mb MiB, warm" "$1" "$(secs ddread "$2")"
}
# listing SYSTEM DIR: cold and warm ls -l of DIR.
listing() {
	dropcaches
	rec "ls -l $ls_n entries, cold" "$1" "$(secs ls -l "$2")"
	rec "ls -l $ls_n entries, warm" "$1" "$(secs ls -l "$2")"
}

# readsys SYSTEM: the read workload on one system.
readsys() {
	case $1 in
	native) reads native "$backing" ;;
	bindfs) reads bindfs "$work/bindr/${digest:0:2}/$digest" ;;
	*)
		local mode=$1 flags
		flags=(--verify="${mode%-nopassthrough}")
		[[ $mode == full-nopassthrough ]] && flags+=(--passthrough=false)
		[[ -n $profile && $r == 1 && $mode == full-nopassthrough ]] && flags+=(--cpuprofile "$profile/read.pprof")
		mountfs "$bin" "$mnt" --data "$data" mount "${flags[@]}"
		reads "alkblobfs $mode" "$mnt/bench/$digest"
		umountfs "$mnt"
		;;
	esac
}
readers=(native bindfs full full-nopassthrough strict publish)

for r in $(seq 1 "$reps"); do
	echo "== repetition $r of $reps"
	# The order rotates each repetition: the first cold read after the
	# others' runs pays for caches below the guest's (a VM host's), and a
	# median over the repetitions leaves that to one figure per system.
	for i in "${!readers[@]}"; do
		readsys "${readers[$(((i + r - 1) % ${#readers[@]}))]}"
	done

	rec "cp $size_mb MiB (+ sync)" native "$(secs sh -c "cp '$work/write-$r.bin' '$native/w-$r' && sync '$native/w-$r'")"
	rm -f "$native/w-$r"
	rec "cp $size_mb MiB (+ sync)" bindfs "$(secs sh -c "cp '$work/write-$r.bin' '$work/bindw/w-$r' && sync '$work/bindw/w-$r'")"
	rm -f "$native/b/w-$r"
	wflags=()
	[[ -n $profile && $r == 1 ]] && wflags=(--cpuprofile "$profile/write.pprof")
	mountfs "$bin" "$mnt" --data "$data" mount "${wflags[@]}"
	rec "cp $size_mb MiB (+ sync)" "alkblobfs full" "$(secs cp "$work/write-$r.bin" "$mnt/bench/incoming/w-$r")"

	rec "cp -r $small_n x 4 KiB (+ sync)" native "$(secs sh -c "cp -r '$work/small-$r' '$native/s-$r' && sync")"
	rm -rf "$native/s-$r"
	rec "cp -r $small_n x 4 KiB (+ sync)" bindfs "$(secs sh -c "cp -r '$work/small-$r' '$work/bindw/s-$r' && sync")"
	rm -rf "$native/b/s-$r"
	rec "cp -r $small_n x 4 KiB (+ sync)" "alkblobfs full" "$(secs sh -c "cp -r '$work/small-$r' '$mnt/bench/incoming/s-$r' && sync")"
	umountfs "$mnt"

	for i in 0 1 2; do
		case $(((i + r - 1) % 3)) in
		0) listing native "$work/lsdir" ;;
		1) listing bindfs "$work/bindls" ;;
		2)
			mountfs "$bin" "$mnt" --data "$data" mount
			listing "alkblobfs full" "$mnt/ls"
			rss=$(awk '/VmHWM/ { print $2 }' "/proc/$(<"$mnt.pid")/status")
			umountfs "$mnt"
			echo "  (daemon peak RSS after the listing: $((rss / 1024)) MiB)"
			;;
		esac
	done
done

echo
echo "alkblobfs bench — $(uname -r), $(nproc) CPUs, $(df -hT "$work" | awk 'NR == 2 { print $2 " on " $1 }'), $reps repetitions, interleaved"
awk -F'\t' -v json="$json" "$MEDIAN_AWK"'
	{
		k = $1 SUBSEP $2
		if (!(k in n)) { if (!($1 in seen)) { seen[$1] = 1; wl[++nw] = $1 } ; sys[$1, ++ns[$1]] = $2 }
		v[k, ++n[k]] = $3
	}
	END {
		printf "%-34s %-28s %9s %9s %9s %7s\n", "workload", "system", "median s", "min s", "max s", "ratio"
		printf "{\"repetitions\": %d, \"results\": [", n[wl[1], sys[wl[1], 1]] > json
		first = 1
		for (i = 1; i <= nw; i++) {
			w = wl[i]
			c = n[w, "native"]
			for (j = 1; j <= c; j++) a[j] = v[w SUBSEP "native", j]
			base = median(a, c)
			for (s = 1; s <= ns[w]; s++) {
				name = sys[w, s]; k = w SUBSEP name; c = n[k]; lo = ""; hi = ""; list = ""
				for (j = 1; j <= c; j++) {
					x = v[k, j]; a[j] = x; list = list (j > 1 ? ", " : "") x
					if (lo == "" || x < lo) lo = x
					if (hi == "" || x > hi) hi = x
				}
				med = median(a, c)
				ratio = med > 0 ? base / med : 0
				flag = (name != "native" && ratio > 1.1) ? "  SUSPECT: faster than native" : ""
				printf "%-34s %-28s %9.3f %9.3f %9.3f %7.2f%s\n", w, name, med, lo, hi, ratio, flag
				printf "%s\n  {\"workload\": \"%s\", \"system\": \"%s\", \"seconds\": [%s], \"median\": %.4f, \"ratio\": %.3f}", (first ? "" : ","), w, name, list, med, ratio > json
				first = 0
			}
		}
		printf "\n]}\n" > json
	}' "$results"
echo "(every figure: $json)"
[[ -n $profile ]] && echo "profiles: $profile/read.pprof $profile/write.pprof (go tool pprof -top $bin FILE)"
exit 0
