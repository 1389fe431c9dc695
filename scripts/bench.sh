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
#                                            # read, write and ls runs (go tool pprof)
#   BENCH_BASE=b419ce4 scripts/bench.sh      # also a base build, "before"
#
# BENCH_BASE names a commit of this repository (built from `git archive`
# of it, so no worktree is touched) or an alkblobfs binary. Its mounts join
# every workload as systems of their own, "base MODE" beside each
# "alkblobfs MODE", interleaved with the others the same way, each on a
# store of its own that the base binary made (same content, same digests),
# so neither build opens a store the other wrote. The table gains their
# rows and ratios, and a last table gives current ÷ base (of median
# seconds: below 1.00 the current build is faster), flagging a row whose
# two min–max ranges do not overlap. With BENCH_PROFILE the base daemon's
# profiles are base-read.pprof, base-write.pprof and base-ls.pprof.
#
# A timed command that fails (a read, a copy, a listing) stops the bench
# with its stderr: a listing that fails fast must not pass for a fast one.
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
base=${BENCH_BASE:-}
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
load0=$(cut -d' ' -f1-3 /proc/loadavg)
bin=$work/alkblobfs
(cd "$root" && go build -o "$bin" ./cmd/alkblobfs)
# basebin, when BENCH_BASE is set: the base build (basedesc says which).
basebin= basedesc=
if [[ -n $base ]]; then
	basebin=$work/alkblobfs-base
	if [[ -f $base ]]; then
		[[ -x $base ]] || { echo "bench.sh: BENCH_BASE=$base is a file but not executable" >&2; exit 1; }
		cp "$base" "$basebin"
		basedesc="binary $base"
	else
		rev=$(git -C "$root" rev-parse --verify --quiet "$base^{commit}") ||
			{ echo "bench.sh: BENCH_BASE=$base is neither a binary nor a commit of $root" >&2; exit 1; }
		mkdir "$work/base-src"
		git -C "$root" archive "$rev" | tar -x -C "$work/base-src"
		(cd "$work/base-src" && go build -o "$basebin" ./cmd/alkblobfs)
		rm -rf "$work/base-src"
		basedesc="commit $(git -C "$root" log -1 --format='%h %cs' "$rev")"
	fi
	echo "== base: $basedesc"
fi
[[ -n $profile ]] && mkdir -p "$profile"

results=$work/results
bindmount() {
	mkdir -p "$2"
	bindfs "$1" "$2"
	binds+=("$2")
}

data=$work/data
mnt=$work/mnt
based=$work/data-base
mntb=$work/mnt-base
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

# fill BIN DATA puts the blob to read and the namespace to list into the
# store at DATA with BIN, and prints the blob's digest.
fill() {
	"$1" --data "$2" ns create bench >/dev/null
	"$1" --data "$2" ns create ls >/dev/null
	"$1" --data "$2" put --ns bench "$work/read.bin"
	(cd "$work/lsdir" && ls | xargs -n 20000 "$1" --data "$2" put --ns ls >/dev/null)
}
echo "== the blob to read, and the namespace to list"
digest=$(fill "$bin" "$data")
if [[ -n $basebin ]]; then
	bdigest=$(fill "$basebin" "$based")
	[[ $bdigest == "$digest" ]] || { echo "bench.sh: the base build stored $bdigest, this one $digest" >&2; exit 1; }
fi
backing=$data/large/blobs/${digest:0:2}/$digest
[[ -f $backing ]] || { echo "bench.sh: no backing file $backing" >&2; exit 1; }
bindmount "$data/large/blobs" "$work/bindr"
bindmount "$work/lsdir" "$work/bindls"
mkdir -p "$native/b"
bindmount "$native/b" "$work/bindw"

# timed WORKLOAD SYSTEM CMD... records CMD's wall time, and stops the bench
# with CMD's stderr if CMD fails: a listing or read that fails fast must not
# pass for a fast one.
timed() {
	local t
	t=$(secs checked "${@:3}")
	if [[ -e $work/failed ]]; then
		echo "bench.sh: $1 on $2 failed: $(<"$work/failed")" >&2
		exit 1
	fi
	rec "$1" "$2" "$t"
}
checked() {
	"$@" 2>"$work/stderr" || { { echo "$* (exit status $?)"; cat "$work/stderr"; } >"$work/failed"; return 1; }
}

# reads SYSTEM FILE: cold, second and warm (third) reads of FILE.
reads() {
	dropcaches
	timed "read $size_mb MiB, cold" "$1" ddread "$2"
	secs checked ddread "$2" >/dev/null
	[[ ! -e $work/failed ]] || { echo "bench.sh: the second read of $2 failed: $(<"$work/failed")" >&2; exit 1; }
	timed "read $size_mb MiB, warm" "$1" ddread "$2"
}
# listing SYSTEM DIR: cold and warm ls -l of DIR.
listing() {
	dropcaches
	timed "ls -l $ls_n entries, cold" "$1" ls -l "$2"
	timed "ls -l $ls_n entries, warm" "$1" ls -l "$2"
}

# readsys SYSTEM: the read workload on one system.
readsys() {
	case $1 in
	native) reads native "$backing" ;;
	bindfs) reads bindfs "$work/bindr/${digest:0:2}/$digest" ;;
	base-*)
		# the base build: BIN DATA MNT LABEL PROFILE after the mode
		alkreads "${1#base-}" "$basebin" "$based" "$mntb" "base ${1#base-}" "$profile/base-read.pprof"
		;;
	*) alkreads "$1" "$bin" "$data" "$mnt" "alkblobfs $1" "$profile/read.pprof" ;;
	esac
}
# alkreads MODE BIN DATA MNT LABEL PROFILE: the read workload on a mount
# of BIN in MODE.
alkreads() {
	local mode=$1 flags
	flags=(--verify="${mode%-nopassthrough}")
	[[ $mode == full-nopassthrough ]] && flags+=(--passthrough=false)
	[[ -n $profile && $r == 1 && $mode == full-nopassthrough ]] && flags+=(--cpuprofile "$6")
	mountfs "$2" "$4" --data "$3" mount "${flags[@]}"
	reads "$5" "$4/bench/$digest"
	umountfs "$4"
}
readers=(native bindfs full full-nopassthrough strict publish)
# With a base build, each mode's base system follows its current one.
[[ -n $basebin ]] && readers=(native bindfs full base-full full-nopassthrough base-full-nopassthrough
	strict base-strict publish base-publish)
# listers: the ls workload's systems, rotated the same way.
listers=(native bindfs alkblobfs)
[[ -n $basebin ]] && listers+=(base)

# bigwrite and smallwrite LABEL MNT: the write workloads, into a mount at MNT.
bigwrite() { timed "cp $size_mb MiB (+ sync)" "$1" cp "$work/write-$r.bin" "$2/bench/incoming/w-$r"; }
smallwrite() { timed "cp -r $small_n x 4 KiB (+ sync)" "$1" sh -c "cp -r '$work/small-$r' '$2/bench/incoming/s-$r' && sync"; }
# listmount BIN DATA MNT LABEL PROFILE: the ls workload on a mount of BIN.
listmount() {
	local lflags=()
	[[ -n $profile && $r == 1 ]] && lflags=(--cpuprofile "$5")
	mountfs "$1" "$3" --data "$2" mount "${lflags[@]}"
	listing "$4" "$3/ls"
	rss=$(awk '/VmHWM/ { print $2 }' "/proc/$(<"$3.pid")/status")
	umountfs "$3"
	echo "  (daemon peak RSS after the listing: $((rss / 1024)) MiB, $4)"
}

for r in $(seq 1 "$reps"); do
	echo "== repetition $r of $reps"
	# The order rotates each repetition: the first cold read after the
	# others' runs pays for caches below the guest's (a VM host's), and a
	# median over the repetitions leaves that to one figure per system.
	for i in "${!readers[@]}"; do
		readsys "${readers[$(((i + r - 1) % ${#readers[@]}))]}"
	done

	timed "cp $size_mb MiB (+ sync)" native sh -c "cp '$work/write-$r.bin' '$native/w-$r' && sync '$native/w-$r'"
	rm -f "$native/w-$r"
	timed "cp $size_mb MiB (+ sync)" bindfs sh -c "cp '$work/write-$r.bin' '$work/bindw/w-$r' && sync '$work/bindw/w-$r'"
	rm -f "$native/b/w-$r"
	wflags=()
	[[ -n $profile && $r == 1 ]] && wflags=(--cpuprofile "$profile/write.pprof")
	mountfs "$bin" "$mnt" --data "$data" mount "${wflags[@]}"
	# With a base build both daemons are mounted for the write workloads,
	# and which of them writes first alternates between repetitions.
	if [[ -n $basebin ]]; then
		wflags=()
		[[ -n $profile && $r == 1 ]] && wflags=(--cpuprofile "$profile/base-write.pprof")
		mountfs "$basebin" "$mntb" --data "$based" mount "${wflags[@]}"
		if ((r % 2)); then
			bigwrite "alkblobfs full" "$mnt"
			bigwrite "base full" "$mntb"
		else
			bigwrite "base full" "$mntb"
			bigwrite "alkblobfs full" "$mnt"
		fi
	else
		bigwrite "alkblobfs full" "$mnt"
	fi

	timed "cp -r $small_n x 4 KiB (+ sync)" native sh -c "cp -r '$work/small-$r' '$native/s-$r' && sync"
	rm -rf "$native/s-$r"
	timed "cp -r $small_n x 4 KiB (+ sync)" bindfs sh -c "cp -r '$work/small-$r' '$work/bindw/s-$r' && sync"
	rm -rf "$native/b/s-$r"
	if [[ -n $basebin ]]; then
		if ((r % 2)); then
			smallwrite "alkblobfs full" "$mnt"
			smallwrite "base full" "$mntb"
		else
			smallwrite "base full" "$mntb"
			smallwrite "alkblobfs full" "$mnt"
		fi
		umountfs "$mntb"
	else
		smallwrite "alkblobfs full" "$mnt"
	fi
	umountfs "$mnt"

	for i in "${!listers[@]}"; do
		case ${listers[$(((i + r - 1) % ${#listers[@]}))]} in
		native) listing native "$work/lsdir" ;;
		bindfs) listing bindfs "$work/bindls" ;;
		alkblobfs) listmount "$bin" "$data" "$mnt" "alkblobfs full" "$profile/ls.pprof" ;;
		base) listmount "$basebin" "$based" "$mntb" "base full" "$profile/base-ls.pprof" ;;
		esac
	done
done

echo
load1=$(cut -d' ' -f1-3 /proc/loadavg)
echo "alkblobfs bench — $(uname -r), $(nproc) CPUs, $(df -hT "$work" | awk 'NR == 2 { print $2 " on " $1 }'), $reps repetitions, interleaved"
echo "load average $load0 at the start, $load1 at the end${basedesc:+; base: $basedesc}"
awk -F'\t' -v json="$json" -v basedesc="$basedesc" "$MEDIAN_AWK"'
	{
		k = $1 SUBSEP $2
		if (!(k in n)) { if (!($1 in seen)) { seen[$1] = 1; wl[++nw] = $1 } ; sys[$1, ++ns[$1]] = $2 }
		v[k, ++n[k]] = $3
	}
	END {
		# every row: median, min, max and the list of figures
		for (i = 1; i <= nw; i++) {
			w = wl[i]
			for (s = 1; s <= ns[w]; s++) {
				k = w SUBSEP sys[w, s]; c = n[k]; lo[k] = ""; hi[k] = ""; list[k] = ""
				for (j = 1; j <= c; j++) {
					x = v[k, j]; a[j] = x; list[k] = list[k] (j > 1 ? ", " : "") x
					if (lo[k] == "" || x < lo[k]) lo[k] = x
					if (hi[k] == "" || x > hi[k]) hi[k] = x
				}
				med[k] = median(a, c)
			}
		}
		printf "%-34s %-28s %9s %9s %9s %7s\n", "workload", "system", "median s", "min s", "max s", "ratio"
		printf "{\"repetitions\": %d, %s\"results\": [", n[wl[1], sys[wl[1], 1]], (basedesc == "" ? "" : "\"base\": \"" basedesc "\", ") > json
		first = 1; nb = 0
		for (i = 1; i <= nw; i++) {
			w = wl[i]
			native = med[w, "native"]
			for (s = 1; s <= ns[w]; s++) {
				name = sys[w, s]; k = w SUBSEP name
				ratio = med[k] > 0 ? native / med[k] : 0
				flag = (name != "native" && ratio > 1.1) ? "  SUSPECT: faster than native" : ""
				printf "%-34s %-28s %9.3f %9.3f %9.3f %7.2f%s\n", w, name, med[k], lo[k], hi[k], ratio, flag
				# a current row with a base row: current ÷ base
				cb = ""
				if (name ~ /^alkblobfs / && ((w SUBSEP "base " substr(name, 11)) in med)) {
					bk = w SUBSEP "base " substr(name, 11)
					cb = sprintf(", \"current_over_base\": %.3f", med[bk] > 0 ? med[k] / med[bk] : 0)
					cmp[++nb] = k; cmpb[nb] = bk
				}
				printf "%s\n  {\"workload\": \"%s\", \"system\": \"%s\", \"seconds\": [%s], \"median\": %.4f, \"ratio\": %.3f%s}", (first ? "" : ","), w, name, list[k], med[k], ratio, cb > json
				first = 0
			}
		}
		printf "\n]}\n" > json
		if (nb == 0) exit
		printf "\ncurrent ÷ base (median seconds; below 1.00 the current build is faster; flagged where the min-max ranges do not overlap)\n"
		printf "%-34s %-20s %-23s %-23s %7s\n", "workload", "mode", "base s (min-max)", "current s (min-max)", "cur÷base"
		for (i = 1; i <= nb; i++) {
			k = cmp[i]; bk = cmpb[i]
			split(k, kw, SUBSEP)
			flag = lo[k] > hi[bk] ? "  slower: ranges apart" : hi[k] < lo[bk] ? "  faster: ranges apart" : ""
			printf "%-34s %-20s %-23s %-23s %7.2f%s\n", kw[1], substr(kw[2], 11), \
				sprintf("%.3f (%.3f-%.3f)", med[bk], lo[bk], hi[bk]), \
				sprintf("%.3f (%.3f-%.3f)", med[k], lo[k], hi[k]), (med[bk] > 0 ? med[k] / med[bk] : 0), flag
		}
	}' "$results"
echo "(every figure: $json)"
[[ -n $profile ]] && echo "profiles: $profile/{read,write,ls}.pprof${basebin:+ and base-*.pprof} (go tool pprof -top FILE)"
exit 0
