#!/usr/bin/env bash
# bench.sh — the mount against the same work done natively, and against
# FUSE peers over the same filesystem (bindfs; JuiceFS when asked), and for
# small files against the go-fuse floor, side by side in one run. Every
# workload runs BENCH_REPS times (default 3),
# interleaved across the systems, with the page cache dropped before every
# cold run; the table gives the median, min and max of each, the ratio of
# medians native ÷ system (1.0 is native speed, higher is better), and for
# the systems with a daemon its CPU (utime + stime from /proc/PID/stat)
# over the timed command, per file for the small-file rows with its context
# switches per file (cputicks and ctxsw in lib.sh). A FUSE system measured
# more than 10% faster than native is flagged SUSPECT: its baseline is
# wrong (not the floor, which stores nothing). The daemons' peak RSS
# (VmHWM) closes the table.
#
#   read   dd of a 1 GiB blob: its backing file (native), bindfs over the
#          blob directory, JuiceFS, and mounts with --verify=full, full
#          without passthrough, strict and publish; cold (caches dropped,
#          fresh mount) and warm (the third read)
#   write  cp of a 1 GiB file (distinct content each repetition) into
#          incoming/, against cp + sync FILE (an fsync of that file, the
#          durability a publish gives) natively and on the peers
#   small  N = 10 000 files of 4 KiB (distinct content for every row and
#          repetition), each copy followed by sync, and on a mount timed
#          until every file's digest is listed in the namespace
#          (`alkblobfs have`; BENCH_LIST_WAIT seconds at most, then the
#          bench stops saying how many are missing):
#            cp -r       of one tree of N files
#            tar -x      of a tar of N files
#            rsync -a    of one tree of N files
#            4 x cp -r   of 4 distinct trees of N/4 files, at once
#            16 x cp -r  of 16 distinct trees of N/16 files, at once
#          also into the go-fuse floor (scripts/fusefloor: a daemon on
#          alkblobfs's go-fuse version and mount options that keeps no
#          content; what go-fuse and the kernel cost a file), and a last
#          table gives each system's daemon CPU per file ÷ the floor's and
#          its speed against the floor's (floor seconds ÷ system seconds)
#   ls     ls -l of a namespace with 100 000 entries (put with the CLI
#          beforehand) against a native directory of the same 64-hex names
#          on the same filesystem, bindfs over it and a JuiceFS copy of it;
#          cold and warm (the second listing)
#
#   sudo scripts/bench.sh                    # as root: drop_caches, mount(2)
#   BENCH_SIZE_MB=256 BENCH_SMALL=2000 BENCH_LS=20000 BENCH_REPS=3 scripts/bench.sh   # quick
#   BENCH_PROFILE=/tmp/prof scripts/bench.sh # CPU profiles of the daemon's
#                                            # read, write and ls runs (go tool pprof)
#   BENCH_BASE=b419ce4 scripts/bench.sh      # also a base build, "before"
#   BENCH_JUICEFS=1 scripts/bench.sh         # also JuiceFS (scripts/juicefs.sh)
#
# Order: in each repetition the systems of a workload run in the order of
# one row of a balanced Latin square (lib.sh's rotation): with BENCH_REPS
# a multiple of the number of systems (of twice it for an odd number)
# every system takes every position and follows every other equally
# often; with fewer the repetitions take rows spread over the square. Before each
# timed write, sync flushes what earlier runs left dirty and the source is
# read once, so every system copies from the page cache.
#
# BENCH_BASE names a commit of this repository (built from `git archive`
# of it, so no worktree is touched) or an alkblobfs binary. Its mounts join
# every workload as systems of their own, "base MODE" beside each
# "alkblobfs MODE", each on a store of its own that the base binary made
# (same content, same digests), so neither build opens a store the other
# wrote. The table gains their rows and ratios, and a last table gives
# current ÷ base (of median seconds: below 1.00 the current build is
# faster), flagging a row whose two min–max ranges do not overlap. With
# BENCH_PROFILE the base daemon's profiles are base-read.pprof,
# base-write.pprof and base-ls.pprof.
#
# BENCH_JUICEFS=1 runs scripts/juicefs.sh, which builds JuiceFS v1.4.1 into
# a cache outside the repository the first time (minutes), and adds it to
# every workload: a volume formatted with sqlite3 metadata and local
# directory storage under the work directory, mounted with its defaults
# (cache directory under the work directory too). Without it, or when it
# cannot be built (the script says why), the bench runs without JuiceFS
# and the table's header says so.
#
# A timed command that fails (a read, a copy, a listing) stops the bench
# with its stderr: a listing that fails fast must not pass for a fast one.
#
# Work happens in $BENCH_DIR (default /var/tmp), so store, sources, peers'
# storage and the native targets share one filesystem. The table is also
# written as JSON (every repetition's figure) to $BENCH_JSON (default
# bench-results.json in the current directory).
set -euo pipefail

size_mb=${BENCH_SIZE_MB:-1024}
small_n=${BENCH_SMALL:-10000}
ls_n=${BENCH_LS:-100000}
reps=${BENCH_REPS:-3}
profile=${BENCH_PROFILE:-}
base=${BENCH_BASE:-}
json=${BENCH_JSON:-bench-results.json}
listwait=${BENCH_LIST_WAIT:-120}
juicefs=${BENCH_JUICEFS:-}
root=$(cd "$(dirname "$0")/.." && pwd)

for v in BENCH_SIZE_MB=$size_mb BENCH_SMALL=$small_n BENCH_LS=$ls_n BENCH_REPS=$reps BENCH_LIST_WAIT=$listwait; do
	[[ ${v#*=} =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: ${v%%=*} must be a positive integer, not '${v#*=}'" >&2; exit 1; }
done
((small_n >= 16)) || { echo "bench.sh: BENCH_SMALL must be at least 16 (16 writers share the files), not $small_n" >&2; exit 1; }
if [[ $(id -u) != 0 ]]; then
	echo "bench.sh: run as root (drop_caches, mount(2), FUSE passthrough)" >&2
	exit 1
fi
for c in bindfs getfattr fusermount3 rsync tar sha256sum perl; do
	command -v "$c" >/dev/null || { echo "bench.sh: $c missing (scripts/ci-deps.sh installs it)" >&2; exit 1; }
done

work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/alkblobfs-bench.XXXXXX")
PROG=bench.sh
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"
binds=()
jfsm=$work/jfs
cleanup() {
	for m in "${binds[@]}"; do fusermount3 -uz "$m" 2>/dev/null || true; done
	fusermount3 -uz "$jfsm" 2>/dev/null || true
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	{ grep -o " $work/[^ ]*" /proc/self/mountinfo || true; } | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	chmod -R u+w "$work" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
load0=$(cut -d' ' -f1-3 /proc/loadavg)
hz=$(getconf CLK_TCK)
bin=$work/alkblobfs
(cd "$root" && go build -o "$bin" ./cmd/alkblobfs)
floorbin=$work/fusefloor
(cd "$root" && go build -o "$floorbin" ./scripts/fusefloor)
floormnt=$work/floor
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

# jfsbin, when JuiceFS was asked for and could be built; jfsnote says
# which for the table's header.
jfsbin=
case $juicefs in
'' | 0) jfsnote="JuiceFS: skipped (BENCH_JUICEFS=1 adds it)" ;;
*)
	echo "== JuiceFS (scripts/juicefs.sh: the first build takes minutes)"
	if jfsbin=$("$root/scripts/juicefs.sh" 2>"$work/juicefs.err"); then
		cat "$work/juicefs.err" >&2
		jfsnote="JuiceFS: $("$jfsbin" --version | sed 's/^juicefs version //') (sqlite3 metadata, local directory storage)"
	else
		cat "$work/juicefs.err" >&2
		jfsbin=
		jfsnote="JuiceFS: skipped, $(grep -m1 '^juicefs.sh: cannot build' "$work/juicefs.err" | sed 's/^juicefs.sh: //' || echo 'scripts/juicefs.sh failed')"
		echo "bench.sh: going on without JuiceFS" >&2
	fi
	;;
esac

results=$work/results
rssfile=$work/rss
: >"$rssfile"
# dpid is the daemon whose CPU the timed command's row gets (none:
# native), nfiles the files the command writes; functions set them locally.
# Every daemon, bindfs, JuiceFS, the floor and alkblobfs alike, is measured
# by cputicks and ctxsw (lib.sh) on the process started, which count all
# its threads and its children: bindfs serves from one thread (libfuse's
# single-threaded loop, its default), go-fuse from several and JuiceFS
# from a child, so the main thread's figure alone (/proc/PID/schedstat)
# would read 0 for the floor. Why bindfs's figure moves between runs and
# tools: it creates and writes each file on the backing filesystem in its
# own system calls, so its CPU per file carries ext4's work, which grows
# with the other I/O on the machine (one cp -r of 2 000 files, minutes
# apart on a shared machine: 80-90 us/file, then 333-789, while the floor
# stayed at 100-190). The floor touches no disk. So bindfs and the floor
# run in the same repetitions as alkblobfs, interleaved, and a figure of
# either from another run or tool does not compare with these.
dpid='' nfiles=0

# waitmounted MNT PID LOG waits (at most 30 s) until MNT is a mount point,
# and stops the bench with LOG if PID exits first or the time runs out.
waitmounted() {
	for _ in $(seq 1 300); do
		grep -q " $1 " /proc/self/mountinfo && return 0
		kill -0 "$2" 2>/dev/null || break
		sleep 0.1
	done
	echo "bench.sh: the mount on $1 did not come up in 30 s:" >&2
	cat "$3" >&2
	exit 1
}
# forget PID drops PID from the daemons the cleanup stops.
forget() {
	local p keep=()
	for p in "${pids[@]}"; do
		[[ $p == "$1" ]] || keep+=("$p")
	done
	pids=("${keep[@]}")
}
# bindmount SRC DST mounts bindfs over SRC at DST, in the foreground of a
# background job, so that DST.pid names the process serving it.
bindmount() {
	mkdir -p "$2"
	bindfs -f "$1" "$2" 2>"$2.log" &
	echo $! >"$2.pid"
	pids+=($!)
	binds+=("$2")
	waitmounted "$2" "$(<"$2.pid")" "$2.log"
}
# jfsmount mounts the JuiceFS volume at $jfsm, afresh; jfspid is the
# process started (it serves from a child: cputicks and peakrss count it).
jfspid=
jfsmount() {
	mkdir -p "$jfsm"
	"$jfsbin" --no-agent mount --no-usage-report --no-syslog --cache-dir "$work/jfs-cache" \
		"sqlite3://$work/jfs.db" "$jfsm" 2>>"$jfsm.log" &
	jfspid=$!
	pids+=("$jfspid")
	waitmounted "$jfsm" "$jfspid" "$jfsm.log"
}
# jfsstop records the JuiceFS daemon's peak RSS, unmounts it and waits
# for it to exit.
jfsstop() {
	rss juicefs "$jfspid"
	kill -TERM "$jfspid"
	wait "$jfspid" || { echo "bench.sh: juicefs on $jfsm exited with $?:" >&2; tail -n 20 "$jfsm.log" >&2; exit 1; }
	forget "$jfspid"
}
# rss LABEL PID keeps PID's peak RSS (VmHWM, KiB) for the closing table.
rss() { printf '%s\t%s\n' "$1" "$(peakrss "$2")" >>"$rssfile"; }

data=$work/data
mnt=$work/mnt
based=$work/data-base
mntb=$work/mnt-base
native=$work/native
mkdir -p "$native"

# mktree DIR N K makes N files of 4 KiB of random content in DIR (K = 0)
# or split over K subdirectories DIR/0 .. DIR/K-1, and lists their
# digests in DIR.digests.
mktree() {
	local i m
	mkdir -p "$1"
	if (($3 == 0)); then
		head -c "$(($2 * 4096))" /dev/urandom | split -b 4096 -a 6 - "$1/f"
	else
		for ((i = 0; i < $3; i++)); do
			m=$(($2 / $3 + (i < $2 % $3 ? 1 : 0)))
			mkdir -p "$1/$i"
			head -c "$((m * 4096))" /dev/urandom | split -b 4096 -a 6 - "$1/$i/f"
		done
	fi
	find "$1" -type f -exec sha256sum {} + | cut -c1-64 >"$1.digests"
}

echo "== sources ($size_mb MiB to read, $size_mb MiB x $reps to write, 5 x $small_n x 4 KiB x $reps, $ls_n tiny files)"
head -c "$((size_mb << 20))" /dev/urandom >"$work/read.bin"
head -c "$((size_mb << 20))" /dev/urandom >"$work/write.bin"
for r in $(seq 1 "$reps"); do
	cp "$work/write.bin" "$work/write-$r.bin"
	printf 'repetition %d' "$r" | dd of="$work/write-$r.bin" conv=notrunc status=none
	mktree "$work/small-$r" "$small_n" 0
	mktree "$work/tar-$r" "$small_n" 0
	tar -c -f "$work/tar-$r.tar" -C "$work/tar-$r" .
	rm -rf "$work/tar-$r"
	mktree "$work/rsync-$r" "$small_n" 0
	mktree "$work/p4-$r" "$small_n" 4
	mktree "$work/p16-$r" "$small_n" 16
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
# The native directory to list gets the namespace's names: each file is
# renamed to the digest of its content.
(cd "$work/lsdir" && find . -type f -print0 | xargs -0 sha256sum |
	perl -ne 'm{^([0-9a-f]{64})  (?:\./)?(.+)$} or die "sha256sum: $_"; rename($2, $1) or die "rename $2: $!\n"')
cmp -s <(cd "$work/lsdir" && LC_ALL=C ls) <("$bin" --data "$data" ls ls) ||
	{ echo "bench.sh: the native directory to list does not hold the namespace's names" >&2; exit 1; }
backing=$data/large/blobs/${digest:0:2}/$digest
[[ -f $backing ]] || { echo "bench.sh: no backing file $backing" >&2; exit 1; }
bindmount "$data/large/blobs" "$work/bindr"
bindmount "$work/lsdir" "$work/bindls"
mkdir -p "$native/b"
bindmount "$native/b" "$work/bindw"
if [[ -n $jfsbin ]]; then
	echo "== the JuiceFS volume: the blob to read and a copy of the directory to list"
	"$jfsbin" --no-agent format --storage file --bucket "$work/jfs-bucket/" --trash-days 0 \
		"sqlite3://$work/jfs.db" bench >"$work/jfs-format.log" 2>&1 ||
		{ echo "bench.sh: juicefs format failed:" >&2; tail -n 20 "$work/jfs-format.log" >&2; exit 1; }
	jfsmount
	mkdir -p "$jfsm/ls" "$jfsm/w"
	cp "$work/read.bin" "$jfsm/read.bin"
	cp -r "$work/lsdir/." "$jfsm/ls/"
	sync
	jfsstop
fi
# basehave: whether the base build has `have` (else its listing is read).
basehave=
[[ -n $basebin ]] && "$basebin" have --help >/dev/null 2>&1 && basehave=1

# timed WORKLOAD SYSTEM CMD... records CMD's wall time, and the CPU that
# the daemon dpid used meanwhile, and stops the bench with CMD's stderr if
# CMD fails: a listing or read that fails fast must not pass for a fast one.
timed() {
	local t c0='' c1='' cpu='' s0='' cs=''
	if [[ -n $dpid ]]; then c0=$(cputicks "$dpid") s0=$(ctxsw "$dpid"); fi
	t=$(secs checked "${@:3}")
	if [[ -e $work/failed ]]; then
		echo "bench.sh: $1 on $2 failed: $(<"$work/failed")" >&2
		exit 1
	fi
	if [[ -n $dpid ]]; then
		c1=$(cputicks "$dpid")
		cs=$(($(ctxsw "$dpid") - s0))
		cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN { printf "%.2f", (b - a) / hz }')
	fi
	rec "$1" "$2" "$t" "$cpu" "$nfiles" "$cs"
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
	local dpid=
	case $1 in
	native) reads native "$backing" ;;
	bindfs)
		dpid=$(<"$work/bindr.pid")
		reads bindfs "$work/bindr/${digest:0:2}/$digest"
		;;
	juicefs)
		jfsmount
		dpid=$jfspid
		reads juicefs "$jfsm/read.bin"
		jfsstop
		;;
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
	local mode=$1 flags dpid
	flags=(--verify="${mode%-nopassthrough}")
	[[ $mode == full-nopassthrough ]] && flags+=(--passthrough=false)
	[[ -n $profile && $r == 1 && $mode == full-nopassthrough ]] && flags+=(--cpuprofile "$6")
	mountfs "$2" "$4" --data "$3" mount "${flags[@]}"
	dpid=$(<"$4.pid")
	reads "$5" "$4/bench/$digest"
	rss "$5" "$dpid"
	umountfs "$4"
}
peers=(bindfs)
[[ -n $jfsbin ]] && peers+=(juicefs)
readers=(native "${peers[@]}" full full-nopassthrough strict publish)
[[ -n $basebin ]] && readers=(native "${peers[@]}" full base-full full-nopassthrough base-full-nopassthrough
	strict base-strict publish base-publish)
# listers and writers: the ls and write workloads' systems.
listers=(native "${peers[@]}" alkblobfs)
# The floor writes small files only: it keeps nothing, so a 1 GiB copy
# into it would time the source's read.
writers=(native "${peers[@]}" floor alkblobfs)
[[ -n $basebin ]] && listers+=(base) && writers+=(base)

# listmount BIN DATA MNT LABEL PROFILE: the ls workload on a mount of BIN.
listmount() {
	local lflags=() dpid kib
	[[ -n $profile && $r == 1 ]] && lflags=(--cpuprofile "$5")
	mountfs "$1" "$3" --data "$2" mount "${lflags[@]}"
	dpid=$(<"$3.pid")
	listing "$4" "$3/ls"
	kib=$(peakrss "$dpid")
	printf '%s\t%s\n' "$4" "$kib" >>"$rssfile"
	umountfs "$3"
	echo "  (daemon peak RSS after the listing: $((kib / 1024)) MiB, $4)"
}

# The write workloads' rows.
row_big="cp $size_mb MiB (+ sync)"
row_cp="cp -r $small_n x 4 KiB (+ sync)"
row_tar="tar -x $small_n x 4 KiB (+ sync)"
row_rsync="rsync -a $small_n x 4 KiB (+ sync)"
row_p4="4 x cp -r, $small_n x 4 KiB (+ sync)"
row_p16="16 x cp -r, $small_n x 4 KiB (+ sync)"

# warm PATH syncs what earlier runs left dirty, then reads PATH (a file, or
# every file under a directory) into the page cache, so that no system
# pays for the others' writeback or for a cold source.
warm() {
	sync
	if [[ -d $1 ]]; then find "$1" -type f -exec cat {} + >/dev/null; else cat "$1" >/dev/null; fi
}
# cpsync SRC DST: cp, then an fsync of DST (sync FILE).
cpsync() { cp "$1" "$2" && sync "$2"; }
# parcp SRC DST K: cp -r SRC/k DST-k for k = 0 .. K-1, all at once.
parcp() {
	local k p=() rc=0
	for ((k = 0; k < $3; k++)); do
		cp -r "$1/$k" "$2-$k" &
		p+=($!)
	done
	for k in "${p[@]}"; do wait "$k" || rc=1; done
	return "$rc"
}
# listed BIN DATA DIGESTS prints how many of the digests in the file
# DIGESTS namespace bench of the store at DATA lists.
listed() {
	if [[ $1 == "$basebin" && -z $basehave ]]; then
		{ "$1" --data "$2" ls bench | grep -cxFf "$3"; } || true
	else
		{ xargs -s 1000000 "$1" --data "$2" have --ns bench <"$3" | grep -c ' present$'; } || true
	fi
}
# waitlisted BIN DATA DIGESTS waits until namespace bench lists every
# digest in DIGESTS, BENCH_LIST_WAIT seconds at most.
waitlisted() {
	local want got t0
	t0=$(date +%s%N)
	want=$(wc -l <"$3")
	while :; do
		got=$(listed "$@")
		((got == want)) && return 0
		if (($(date +%s%N) - t0 >= listwait * 1000000000)); then
			echo "after ${listwait} s, namespace bench of $2 lists $got of the $want digests of $(basename "$3" .digests)" >&2
			return 1
		fi
		sleep 0.05
	done
}
# wrote DIGESTS CMD...: CMD, then sync, then on a mount (lbin set) the wait
# until every digest in DIGESTS is listed.
wrote() {
	local d=$1
	shift
	"$@" && sync && { [[ -z $lbin ]] || waitlisted "$lbin" "$ldata" "$d"; }
}

# writeone WORKLOAD SYSTEM: one write row on one system (repetition r).
writeone() {
	local lab into dpid='' lbin='' ldata='' nfiles=$small_n src
	case $2 in
	native) lab=native into=$native ;;
	bindfs) lab=bindfs into=$work/bindw dpid=$(<"$work/bindw.pid") ;;
	juicefs) lab=juicefs into=$jfsm/w dpid=$jfspid ;;
	alkblobfs) lab="alkblobfs full" into=$mnt/bench/incoming dpid=$(<"$mnt.pid") lbin=$bin ldata=$data ;;
	base) lab="base full" into=$mntb/bench/incoming dpid=$(<"$mntb.pid") lbin=$basebin ldata=$based ;;
	floor) lab="go-fuse floor" into=$floormnt/bench/incoming dpid=$(<"$floormnt.pid") ;;
	esac
	case $1 in
	big)
		[[ $2 == floor ]] && return 0
		nfiles=0
		warm "$work/write-$r.bin"
		if [[ -n $lbin ]]; then
			# the close publishes: the blob is fsynced and linked
			timed "$row_big" "$lab" cp "$work/write-$r.bin" "$into/w-$r"
		else
			timed "$row_big" "$lab" cpsync "$work/write-$r.bin" "$into/w-$r"
			rm -f "$into/w-$r"
		fi
		;;
	cp)
		warm "$work/small-$r"
		timed "$row_cp" "$lab" wrote "$work/small-$r.digests" cp -r "$work/small-$r" "$into/s-$r"
		;;
	tar)
		warm "$work/tar-$r.tar"
		mkdir "$into/t-$r"
		timed "$row_tar" "$lab" wrote "$work/tar-$r.digests" tar -x -f "$work/tar-$r.tar" -C "$into/t-$r"
		;;
	rsync)
		warm "$work/rsync-$r"
		timed "$row_rsync" "$lab" wrote "$work/rsync-$r.digests" rsync -a "$work/rsync-$r/" "$into/r-$r/"
		;;
	p4 | p16)
		src=$work/$1-$r
		warm "$src"
		if [[ $1 == p4 ]]; then
			timed "$row_p4" "$lab" wrote "$src.digests" parcp "$src" "$into/$1-$r" 4
		else
			timed "$row_p16" "$lab" wrote "$src.digests" parcp "$src" "$into/$1-$r" 16
		fi
		;;
	esac
}

for r in $(seq 1 "$reps"); do
	echo "== repetition $r of $reps"
	# Each workload's systems run in the order of one row of a balanced
	# Latin square: the first cold read after the others' runs pays for
	# caches below the guest's (a VM host's), the read right after another
	# system's read of the same file gains from them, and a median over the
	# repetitions leaves that to one figure per system.
	for i in $(rotation "${#readers[@]}" "$r" "$reps"); do
		readsys "${readers[i]}"
	done

	wflags=()
	[[ -n $profile && $r == 1 ]] && wflags=(--cpuprofile "$profile/write.pprof")
	mountfs "$bin" "$mnt" --data "$data" mount "${wflags[@]}"
	if [[ -n $basebin ]]; then
		wflags=()
		[[ -n $profile && $r == 1 ]] && wflags=(--cpuprofile "$profile/base-write.pprof")
		mountfs "$basebin" "$mntb" --data "$based" mount "${wflags[@]}"
	fi
	[[ -n $jfsbin ]] && jfsmount
	mountfs "$floorbin" "$floormnt"
	order=$(rotation "${#writers[@]}" "$r" "$reps")
	for w in big cp tar rsync p4 p16; do
		for i in $order; do
			writeone "$w" "${writers[i]}"
		done
	done
	rss "alkblobfs full" "$(<"$mnt.pid")"
	umountfs "$mnt"
	if [[ -n $basebin ]]; then
		rss "base full" "$(<"$mntb.pid")"
		umountfs "$mntb"
	fi
	[[ -n $jfsbin ]] && jfsstop
	rss "go-fuse floor" "$(<"$floormnt.pid")"
	umountfs "$floormnt"
	rm -rf "${native:?}"/[!b]* "$native"/b/*

	for i in $(rotation "${#listers[@]}" "$r" "$reps"); do
		case ${listers[i]} in
		native) listing native "$work/lsdir" ;;
		bindfs) dpid=$(<"$work/bindls.pid") listing bindfs "$work/bindls" ;;
		juicefs)
			jfsmount
			dpid=$jfspid listing juicefs "$jfsm/ls"
			jfsstop
			;;
		alkblobfs) listmount "$bin" "$data" "$mnt" "alkblobfs full" "$profile/ls.pprof" ;;
		base) listmount "$basebin" "$based" "$mntb" "base full" "$profile/base-ls.pprof" ;;
		esac
	done
done
for m in bindr bindls bindw; do rss bindfs "$(<"$work/$m.pid")"; done

echo
load1=$(cut -d' ' -f1-3 /proc/loadavg)
echo "alkblobfs bench — $(uname -r), $(nproc) CPUs, $(df -hT "$work" | awk 'NR == 2 { print $2 " on " $1 }'), $reps repetitions, interleaved"
echo "load average $load0 at the start, $load1 at the end${basedesc:+; base: $basedesc}"
echo "$jfsnote"
# The table's order of systems.
sysorder="native|bindfs|juicefs|go-fuse floor|alkblobfs full|base full|alkblobfs full-nopassthrough|base full-nopassthrough|alkblobfs strict|base strict|alkblobfs publish|base publish"
awk -F'\t' -v json="$json" -v basedesc="$basedesc" -v jfsnote="$jfsnote" -v sysorder="$sysorder" -v rssfile="$rssfile" "$MEDIAN_AWK"'
	BEGIN {
		no = split(sysorder, so, "|"); for (i = 1; i <= no; i++) rank[so[i]] = i
		gsub(/\\/, "\\\\", jfsnote); gsub(/"/, "\\\"", jfsnote)
	}
	{
		k = $1 SUBSEP $2
		if (!(k in n)) {
			if (!($1 in seen)) { seen[$1] = 1; wl[++nw] = $1 }
			# keep each workload'"'"'s systems in the order of sysorder
			c = ++ns[$1]; r = ($2 in rank) ? rank[$2] : no + c
			while (c > 1 && sr[$1, c - 1] > r) { sys[$1, c] = sys[$1, c - 1]; sr[$1, c] = sr[$1, c - 1]; c-- }
			sys[$1, c] = $2; sr[$1, c] = r
		}
		v[k, ++n[k]] = $3
		if ($4 != "") { cv[k, ++ncpu[k]] = $4; files[k] = $5 + 0 }
		if ($6 != "") sv[k, ++ncs[k]] = $6
	}
	END {
		# every row: median, min, max and the list of figures; the daemon CPU
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
				clist[k] = ""
				if (ncpu[k] > 0) {
					for (j = 1; j <= ncpu[k]; j++) { a[j] = cv[k, j]; clist[k] = clist[k] (j > 1 ? ", " : "") cv[k, j] }
					cmed[k] = median(a, ncpu[k])
				}
				if (ncs[k] > 0) {
					for (j = 1; j <= ncs[k]; j++) a[j] = sv[k, j]
					smed[k] = median(a, ncs[k])
				}
			}
		}
		printf "%-38s %-28s %9s %9s %9s %7s %7s %8s %7s\n", "workload", "system", "median s", "min s", "max s", "ratio", "cpu s", "us/file", "cs/file"
		printf "{\"repetitions\": %d, %s\"juicefs\": \"%s\", \"results\": [", n[wl[1], sys[wl[1], 1]], (basedesc == "" ? "" : "\"base\": \"" basedesc "\", "), jfsnote > json
		first = 1; nb = 0
		for (i = 1; i <= nw; i++) {
			w = wl[i]
			native = med[w, "native"]
			for (s = 1; s <= ns[w]; s++) {
				name = sys[w, s]; k = w SUBSEP name
				ratio = med[k] > 0 ? native / med[k] : 0
				# the floor stores nothing: faster than native is its due
				flag = (name != "native" && name != "go-fuse floor" && ratio > 1.1) ? "  SUSPECT: faster than native" : ""
				cpu = ncpu[k] > 0 ? sprintf("%7.2f", cmed[k]) : sprintf("%7s", "-")
				per = ncpu[k] > 0 && files[k] > 0 ? sprintf("%8.0f", cmed[k] * 1e6 / files[k]) : sprintf("%8s", "-")
				cs = ncs[k] > 0 && files[k] > 0 ? sprintf("%7.1f", smed[k] / files[k]) : sprintf("%7s", "-")
				printf "%-38s %-28s %9.3f %9.3f %9.3f %7.2f %s %s %s%s\n", w, name, med[k], lo[k], hi[k], ratio, cpu, per, cs, flag
				# a current row with a base row: current ÷ base
				cb = ""
				if (name ~ /^alkblobfs / && ((w SUBSEP "base " substr(name, 11)) in med)) {
					bk = w SUBSEP "base " substr(name, 11)
					cb = sprintf(", \"current_over_base\": %.3f", med[bk] > 0 ? med[k] / med[bk] : 0)
					cmp[++nb] = k; cmpb[nb] = bk
				}
				if (ncpu[k] > 0) {
					cb = cb sprintf(", \"daemon_cpu_seconds\": [%s]", clist[k])
					if (files[k] > 0) cb = cb sprintf(", \"files\": %d, \"daemon_cpu_us_per_file\": %.1f", files[k], cmed[k] * 1e6 / files[k])
				}
				if (ncs[k] > 0 && files[k] > 0) cb = cb sprintf(", \"daemon_ctxsw_per_file\": %.1f", smed[k] / files[k])
				# against the go-fuse floor in the same workload: CPU per
				# file ÷ the floor'"'"'s, and speed (floor seconds ÷ these)
				fk = w SUBSEP "go-fuse floor"
				if (name != "go-fuse floor" && name != "native" && (fk in med) && cmed[fk] > 0 && files[k] > 0) {
					cb = cb sprintf(", \"cpu_per_file_over_floor\": %.3f, \"speed_vs_floor\": %.3f", cmed[k] / cmed[fk], med[k] > 0 ? med[fk] / med[k] : 0)
					fl[++nf] = k; flk[nf] = fk
				}
				printf "%s\n  {\"workload\": \"%s\", \"system\": \"%s\", \"seconds\": [%s], \"median\": %.4f, \"ratio\": %.3f%s}", (first ? "" : ","), w, name, list[k], med[k], ratio, cb > json
				first = 0
			}
		}
		printf "\n], \"peak_rss_mib\": {" > json
		# the daemons'"'"' peak RSS: the highest VmHWM of each system'"'"'s mounts
		while ((getline line < rssfile) > 0) {
			split(line, f, "\t")
			if (!(f[1] in rss)) {
				# in the order of sysorder
				c = ++nr; r = (f[1] in rank) ? rank[f[1]] : no + c
				while (c > 1 && rr[c - 1] > r) { rsys[c] = rsys[c - 1]; rr[c] = rr[c - 1]; c-- }
				rsys[c] = f[1]; rr[c] = r; rss[f[1]] = 0
			}
			if (f[2] + 0 > rss[f[1]]) rss[f[1]] = f[2] + 0
		}
		printf "\ndaemon peak RSS (VmHWM, the highest of each system'"'"'s mounts):"
		for (i = 1; i <= nr; i++) {
			printf "%s %s %.0f MiB", (i > 1 ? "," : ""), rsys[i], rss[rsys[i]] / 1024
			printf "%s\"%s\": %.1f", (i > 1 ? ", " : ""), rsys[i], rss[rsys[i]] / 1024 > json
		}
		printf "\n"
		printf "}}\n" > json
		if (nf > 0) {
			printf "\nagainst the go-fuse floor (scripts/fusefloor; same run): daemon CPU per file ÷ the floor'"'"'s (1.00 is go-fuse'"'"'s own cost), and speed (floor median s ÷ system median s; 1.00 is the floor'"'"'s speed)\n"
			printf "%-38s %-28s %12s %12s %9s %9s\n", "workload", "system", "us/file", "floor us", "cpu÷floor", "speed"
			for (i = 1; i <= nf; i++) {
				k = fl[i]; fk = flk[i]
				split(k, kw, SUBSEP)
				printf "%-38s %-28s %12.0f %12.0f %9.2f %9.2f\n", kw[1], kw[2], cmed[k] * 1e6 / files[k], cmed[fk] * 1e6 / files[fk], cmed[k] / cmed[fk], (med[k] > 0 ? med[fk] / med[k] : 0)
			}
		}
		if (nb == 0) exit
		printf "\ncurrent ÷ base (median seconds; below 1.00 the current build is faster; flagged where the min-max ranges do not overlap)\n"
		printf "%-38s %-20s %-23s %-23s %7s\n", "workload", "mode", "base s (min-max)", "current s (min-max)", "cur÷base"
		for (i = 1; i <= nb; i++) {
			k = cmp[i]; bk = cmpb[i]
			split(k, kw, SUBSEP)
			# one figure a side is no range
			flag = n[k] < 2 || n[bk] < 2 ? "" : lo[k] > hi[bk] ? "  slower: ranges apart" : hi[k] < lo[bk] ? "  faster: ranges apart" : ""
			printf "%-38s %-20s %-23s %-23s %7.2f%s\n", kw[1], substr(kw[2], 11), \
				sprintf("%.3f (%.3f-%.3f)", med[bk], lo[bk], hi[bk]), \
				sprintf("%.3f (%.3f-%.3f)", med[k], lo[k], hi[k]), (med[bk] > 0 ? med[k] / med[bk] : 0), flag
		}
	}' "$results"
echo "(every figure: $json)"
[[ -n $profile ]] && echo "profiles: $profile/{read,write,ls}.pprof${basebin:+ and base-*.pprof} (go tool pprof -top FILE)"
exit 0
