#!/usr/bin/env bash
# bench.sh — the mount against the same work done natively, side by side in
# one run, with bindfs over the same directory as a FUSE peer:
#
#   read   dd of a 1 GiB blob through the mount (--verify=full, full without
#          passthrough, publish) vs dd of its backing file, cold (caches
#          dropped) and warm; and through bindfs
#   write  cp of a 1 GiB file into incoming/ vs cp into a native directory
#          (and cp + sync: publishing fsyncs, plain cp does not)
#   small  cp -r of 10 000 files of 4 KiB into incoming/ vs native
#   ls     ls -l of a namespace with 100 000 entries vs a native directory
#          with 100 000 files, cold and warm
#
#   sudo scripts/bench.sh                    # as root: drop_caches, mount(2)
#   BENCH_SIZE_MB=256 BENCH_SMALL=2000 BENCH_LS=20000 scripts/bench.sh   # quick
#   BENCH_PROFILE=/tmp/prof scripts/bench.sh # CPU profiles of the daemon's
#                                            # read and write runs (go tool pprof)
#
# Work happens in $BENCH_DIR (default /var/tmp), so store, sources and the
# native targets share one filesystem. Times are the best of $BENCH_REPS
# (default 3) runs for warm measurements, one run for cold ones and for
# writes (a re-put would dedup). Ratios are native time / mount time: 1.0 is
# native speed, higher is better.
set -euo pipefail

size_mb=${BENCH_SIZE_MB:-1024}
small_n=${BENCH_SMALL:-10000}
ls_n=${BENCH_LS:-100000}
reps=${BENCH_REPS:-3}
profile=${BENCH_PROFILE:-}
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
cleanup() {
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

# secs CMD... runs CMD and prints its wall time in seconds.
secs() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >/dev/null 2>&1
	t1=$(date +%s%N)
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", (b - a) / 1e9 }'
}
# best N CMD... is the smallest of N runs.
best() {
	local n=$1 b=""
	shift
	for ((i = 0; i < n; i++)); do
		local s
		s=$(secs "$@")
		if [[ -z $b ]] || awk -v s="$s" -v b="$b" 'BEGIN { exit !(s < b) }'; then b=$s; fi
	done
	echo "$b"
}

rows=()
# row NAME NATIVE_SECS MOUNT_SECS TARGET [NOTE]
row() {
	local ratio
	ratio=$(awk -v n="$2" -v m="$3" 'BEGIN { printf "%.2f", n / m }')
	rows+=("$(printf '%-44s %9.3f %9.3f %7s   %-7s %s' "$1" "$2" "$3" "$ratio" "$4" "${5:-}")")
	echo "  $1: native ${2}s, mount ${3}s, ratio $ratio"
}
mbps() { awk -v s="$1" -v mb="$size_mb" 'BEGIN { printf "%.0f MB/s", mb / s }'; }

data=$work/data
mnt=$work/mnt
native=$work/native
mkdir -p "$native"

echo "== sources ($size_mb MiB x2, $small_n x 4 KiB, $ls_n tiny files)"
head -c "$((size_mb << 20))" /dev/urandom >"$work/read.bin"
head -c "$((size_mb << 20))" /dev/urandom >"$work/write.bin"
mkdir -p "$work/small" "$work/lsdir"
head -c "$((small_n * 4096))" /dev/urandom | split -b 4096 -a 6 - "$work/small/f"
seq -w 1 "$ls_n" | (cd "$work/lsdir" && split -l 1 -a 6 - f)

echo "== read: publish the blob"
mountfs "$bin" "$mnt" --data "$data" mount
mkdir "$mnt/bench"
cp "$work/read.bin" "$mnt/bench/incoming/read.bin"
digest=$(getfattr --absolute-names --only-values -n user.alkblobfs.digest "$mnt/bench/incoming/read.bin")
umountfs "$mnt"
backing=$data/large/blobs/${digest:0:2}/$digest
[[ -f $backing ]] || { echo "bench.sh: no backing file $backing" >&2; exit 1; }

ddread() { dd if="$1" of=/dev/null bs=1M; }
dropcaches
n_cold=$(secs ddread "$backing")
n_warm=$(best "$reps" ddread "$backing")
echo "  native dd: cold ${n_cold}s ($(mbps "$n_cold")), warm ${n_warm}s ($(mbps "$n_warm"))"

for mode in "full" "full-nopassthrough" "publish"; do
	flags=(--verify=full)
	case $mode in
	full-nopassthrough) flags+=(--passthrough=false) ;;
	publish) flags=(--verify=publish) ;;
	esac
	[[ -n $profile && $mode == full-nopassthrough ]] && flags+=(--cpuprofile "$profile/read.pprof")
	mountfs "$bin" "$mnt" --data "$data" mount "${flags[@]}"
	dropcaches
	c=$(secs ddread "$mnt/bench/$digest")
	w=$(best "$reps" ddread "$mnt/bench/$digest")
	pt=$(awk '/"passthrough"/ { p = 1 } p && /"opens"/ { gsub(/[^0-9]/, ""); print; exit }' "$mnt/.alkblobfs/stats")
	umountfs "$mnt"
	note=""
	[[ $mode == full ]] && note="(cold: verified through the daemon; warm: passthrough once verified)"
	[[ $mode == full-nopassthrough ]] && note="(warm: FUSE page cache)"
	row "read $size_mb MiB, --verify=$mode, cold" "$n_cold" "$c" "$([[ $mode == publish ]] && echo '>=0.9' || echo '>=0.5')" "$(mbps "$c")"
	row "read $size_mb MiB, --verify=$mode, warm" "$n_warm" "$w" "$([[ $mode == full-nopassthrough ]] && echo '>=0.5' || echo '>=0.9')" "$(mbps "$w") passthrough opens=$pt $note"
done

mkdir -p "$work/bind"
bindfs "$data/large/blobs" "$work/bind"
dropcaches
c=$(secs ddread "$work/bind/${digest:0:2}/$digest")
w=$(best "$reps" ddread "$work/bind/${digest:0:2}/$digest")
fusermount3 -u "$work/bind"
row "read $size_mb MiB, bindfs (FUSE peer), cold" "$n_cold" "$c" "-" "$(mbps "$c")"
row "read $size_mb MiB, bindfs (FUSE peer), warm" "$n_warm" "$w" "-" "$(mbps "$w")"

echo "== write"
n=$(secs cp "$work/write.bin" "$native/write.bin")
rm -f "$native/write.bin"
ns=$(secs sh -c "cp '$work/write.bin' '$native/write.bin' && sync '$native/write.bin'")
rm -f "$native/write.bin"
wflags=()
[[ -n $profile ]] && wflags=(--cpuprofile "$profile/write.pprof")
mountfs "$bin" "$mnt" --data "$data" mount "${wflags[@]}"
m=$(secs cp "$work/write.bin" "$mnt/bench/incoming/write.bin")
row "cp $size_mb MiB into incoming/" "$n" "$m" ">=0.5" "$(mbps "$m")"
row "cp $size_mb MiB into incoming/ vs cp + sync" "$ns" "$m" "-" "(publish fsyncs the blob)"
mkdir -p "$native/b" "$work/bindw"
bindfs "$native/b" "$work/bindw"
b=$(secs cp "$work/write.bin" "$work/bindw/write.bin")
row "cp $size_mb MiB into bindfs (FUSE peer)" "$n" "$b" "-" "$(mbps "$b")"

echo "== small files"
n=$(secs cp -r "$work/small" "$native/small")
m=$(secs cp -r "$work/small" "$mnt/bench/incoming/small")
row "cp -r $small_n x 4 KiB into incoming/" "$n" "$m" ">=0.3"
b=$(secs cp -r "$work/small" "$work/bindw/small")
fusermount3 -u "$work/bindw"
row "cp -r $small_n x 4 KiB into bindfs (FUSE peer)" "$n" "$b" "-"

echo "== ls -l"
mkdir "$mnt/ls"
fill=$(secs cp -r "$work/lsdir" "$mnt/ls/incoming/")
echo "  (filled the namespace with $ls_n files through incoming/ in ${fill}s)"
umountfs "$mnt"
mountfs "$bin" "$mnt" --data "$data" mount
count=$(ls "$mnt/ls" | wc -l)
[[ $count == $((ls_n + 1)) ]] || { echo "bench.sh: namespace lists $count entries, want $((ls_n + 1))" >&2; exit 1; }
umountfs "$mnt"
mountfs "$bin" "$mnt" --data "$data" mount
dropcaches
mc=$(secs ls -l "$mnt/ls")
mw=$(best "$reps" ls -l "$mnt/ls")
umountfs "$mnt"
dropcaches
nc=$(secs ls -l "$work/lsdir")
nw=$(best "$reps" ls -l "$work/lsdir")
mkdir -p "$work/bindls"
bindfs "$work/lsdir" "$work/bindls"
dropcaches
bc=$(secs ls -l "$work/bindls")
bw=$(best "$reps" ls -l "$work/bindls")
fusermount3 -u "$work/bindls"
row "ls -l of $ls_n entries, cold" "$nc" "$mc" ">=0.5"
row "ls -l of $ls_n entries, warm" "$nw" "$mw" ">=0.5"
row "ls -l of $ls_n entries, bindfs (FUSE peer), cold" "$nc" "$bc" "-"
row "ls -l of $ls_n entries, bindfs (FUSE peer), warm" "$nw" "$bw" "-"

echo
echo "alkblobfs bench — $(uname -r), $(nproc) CPUs, $(df -hT "$work" | awk 'NR == 2 { print $2 " on " $1 }')"
printf '%-44s %9s %9s %7s   %-7s %s\n' "test" "native s" "mount s" "ratio" "target" "note"
printf '%s\n' "${rows[@]}"
[[ -n $profile ]] && echo "profiles: $profile/read.pprof $profile/write.pprof (go tool pprof -top $bin FILE)"
exit 0
