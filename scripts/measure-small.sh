#!/usr/bin/env bash
# measure-small.sh — what a small file costs the daemon through the mount:
# a copy of N distinct 4 KiB files into a namespace's incoming/ (`cp -r`,
# `tar -x` or `rsync -a`), then `sync`, on the embedded default store
# (SQLite kv, local large tier), a fresh data directory per run. Each run
# prints
#
#   cpu µs/file  the daemon's utime+stime (/proc/PID/stat) from just before
#                the copy until every digest is listed, ÷ N
#   KiB/file     what the daemon wrote to storage meanwhile (write_bytes of
#                /proc/PID/io: the kv database's WAL and its checkpoints
#                into the database file; a 4 KiB file never reaches the
#                large tier), ÷ N. The kernel counts a page once per
#                time it is dirtied, so rewrites of a page not yet written
#                back count once.
#   wall s       copy + sync, and until every digest is listed (with
#                `alkblobfs ls NS` in a process of its own, so that the
#                daemon is not charged for the polling)
#   ms/file      copy + sync ÷ N
#
# beside the same tool + `sync` of the same tree into a native directory
# of the same filesystem (the ratio is native ÷ mount, 1.0 is native
# speed).
#
#   scripts/measure-small.sh [-n N] [-r REPS] [--tool cp|tar|rsync] [--base BIN|COMMIT] [--bin BIN] [--quota] [--profile DIR] [--pages]
#
#   -n N            files per run (default 10000)
#   -r REPS         repetitions (default 3); medians are printed
#   --tool TOOL     the copy: cp (cp -r, the default), tar (tar -x of a
#                   tar of the tree, made once) or rsync (rsync -a)
#   --bin BIN       the binary measured (default: built from this tree)
#   --base BIN|COMMIT  also a "before" build (a binary, or a commit of this
#                   repository built from `git archive`, no worktree
#                   touched): each repetition runs both, alternating which
#                   goes first, and the summary gives both medians
#   --quota         also "quota": the measured binary with a quota on the
#                   namespace (far above what the copy needs, so every
#                   close is checked against it and none refused), each
#                   repetition beside the same binary without one: what a
#                   quota costs a close
#   --profile DIR   the first repetition of each binary also writes a CPU
#                   profile (mount --cpuprofile, the daemon's whole life)
#                   and a heap profile at unmount (mount --memprofile, for
#                   go tool pprof -sample_index=alloc_objects) into DIR as
#                   LABEL.cpu.pprof and LABEL.heap.pprof, beside the
#                   binary, LABEL.bin (LABEL is before or after)
#   --pages         after the timed repetitions, one more copy per binary
#                   (never timed) under strace, which records every page
#                   the daemon writes to the kv database: WAL frames, and
#                   the checkpoint's writes into the database file; each
#                   page is then named by the b-tree (table or index) that
#                   holds it (sqlite3's dbstat), and the pages per file of
#                   each are printed: what sets KiB/file. Needs strace and
#                   sqlite3.
#
# Needs root (mount(2)) and FUSE. Work happens in $SMALL_DIR (default
# /var/tmp): sources, stores and the native target share one filesystem.
set -euo pipefail

n=10000 reps=3 base= bin= profile= tool=cp quota= pages=
while (($#)); do
	case $1 in
	-n) n=$2; shift 2 ;;
	--tool) tool=$2; shift 2 ;;
	-r) reps=$2; shift 2 ;;
	--base) base=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	--profile) profile=$2; shift 2 ;;
	--quota) quota=1; shift ;;
	--pages) pages=1; shift ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "measure-small.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "measure-small.sh: -n wants a positive count, not $n" >&2; exit 2; }
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "measure-small.sh: -r wants a positive count, not $reps" >&2; exit 2; }
case $tool in cp | tar | rsync) ;; *) echo "measure-small.sh: --tool wants cp, tar or rsync, not $tool" >&2; exit 2 ;; esac
command -v "$tool" >/dev/null || { echo "measure-small.sh: $tool is not installed" >&2; exit 1; }
if [[ -n $pages ]]; then
	for c in strace sqlite3; do
		command -v "$c" >/dev/null || { echo "measure-small.sh: --pages needs $c" >&2; exit 1; }
	done
fi
[[ $(id -u) == 0 ]] || { echo "measure-small.sh: run as root (mount(2))" >&2; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${SMALL_DIR:-/var/tmp}/alkblobfs-small.XXXXXX")
PROG=measure-small.sh
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	{ grep -o " $work/[^ ]*" /proc/self/mountinfo || true; } | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

# build SPEC OUT: OUT is the binary SPEC names (a file), or built from
# commit SPEC, or (SPEC empty) from this tree.
build() {
	local spec=$1 out=$2 rev
	if [[ -z $spec ]]; then
		(cd "$root" && go build -o "$out" ./cmd/alkblobfs)
	elif [[ -f $spec ]]; then
		[[ -x $spec ]] || { echo "$PROG: $spec is a file but not executable" >&2; exit 1; }
		cp "$spec" "$out"
	else
		rev=$(git -C "$root" rev-parse --verify --quiet "$spec^{commit}") ||
			{ echo "$PROG: $spec is neither a binary nor a commit of $root" >&2; exit 1; }
		mkdir "$work/src"
		git -C "$root" archive "$rev" | tar -x -C "$work/src"
		(cd "$work/src" && go build -o "$out" ./cmd/alkblobfs)
		rm -rf "$work/src"
	fi
}
build "$bin" "$work/after"
labels=(after)
if [[ -n $base ]]; then
	build "$base" "$work/before"
	labels=(before after)
fi
if [[ -n $quota ]]; then
	cp "$work/after" "$work/quota"
	labels+=(quota)
fi
if [[ -n $profile ]]; then
	mkdir -p "$profile"
	for l in "${labels[@]}"; do cp "$work/$l" "$profile/$l.bin"; done
fi

echo "== $n files of 4 KiB, $tool"
mkdir "$work/src-tree"
head -c "$((n * 4096))" /dev/urandom | split -b 4096 -a 6 - "$work/src-tree/f"
if [[ $tool == tar ]]; then tar -c -f "$work/src.tar" -C "$work/src-tree" .; fi
hz=$(getconf CLK_TCK)
results=$work/results

# cputicks PID: the process's utime+stime in clock ticks.
cputicks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# wbytes PID: the bytes the process caused to be written to storage.
wbytes() { awk '$1 == "write_bytes:" { print $2 }' "/proc/$1/io"; }
now() { date +%s%N; }

# copy DEST: the tool's copy of the tree into DEST (a new directory), then
# sync.
copy() {
	case $tool in
	cp) cp -r "$work/src-tree" "$1" ;;
	tar) mkdir "$1" && tar -x -f "$work/src.tar" -C "$1" ;;
	rsync) rsync -a "$work/src-tree/" "$1/" ;;
	esac
	sync
}

# listed BIN DATA: how many digests namespace bench links.
listed() { "$1" --data "$2" ls bench | wc -l; }

# run LABEL REP: one copy into a fresh store with binary LABEL.
run() {
	local label=$1 r=$2 b=$work/$1 data=$work/data-$1-$2 mnt=$work/mnt-$1-$2 flags=() pid c0 c1 w0 w1 t0 t1 t2 got
	mkdir -p "$data" && chmod 700 "$data"
	"$b" --data "$data" ns create bench >/dev/null
	if [[ $label == quota ]]; then
		"$b" --data "$data" ns quota bench --bytes 1TiB --blobs 1000000000 >/dev/null
	fi
	if [[ -n $profile && $r == 1 ]]; then
		flags=(--cpuprofile "$profile/$label.cpu.pprof" --memprofile "$profile/$label.heap.pprof")
	fi
	mountfs "$b" "$mnt" --data "$data" mount "${flags[@]}"
	pid=$(<"$mnt.pid")
	c0=$(cputicks "$pid")
	w0=$(wbytes "$pid")
	t0=$(now)
	copy "$mnt/bench/incoming/s"
	t1=$(now)
	# Every close returned once its version committed; the link follows
	# at the RELEASE. Wait (bounded) until all N are listed.
	for _ in $(seq 1 600); do
		got=$(listed "$b" "$data")
		((got >= n)) && break
		sleep 0.05
	done
	t2=$(now)
	c1=$(cputicks "$pid")
	w1=$(wbytes "$pid")
	((got == n)) || { echo "$PROG: $label listed $got of $n digests 30 s after the copy" >&2; exit 1; }
	umountfs "$mnt"
	rm -rf "$data" "$mnt"
	awk -v l="$label" -v r="$r" -v c="$((c1 - c0))" -v w="$((w1 - w0))" -v hz="$hz" -v n="$n" -v a="$t0" -v b="$t1" -v e="$t2" 'BEGIN {
		us = c / hz * 1e6 / n
		kib = w / 1024 / n
		printf "%s\t%.1f\t%.3f\t%.3f\t%.2f\n", l, us, (b - a) / 1e9, (e - a) / 1e9, kib >> "'"$results"'"
		printf "  rep %d %-7s daemon CPU %7.1f µs/file   written %6.2f KiB/file   copy + sync %6.3f s (%.3f ms/file)   until listed %6.3f s\n", r, l, us, kib, (b - a) / 1e9, (b - a) / 1e6 / n, (e - a) / 1e9
	}'
}

native() {
	local r=$1 t0 t1
	t0=$(now)
	copy "$work/native-$r"
	t1=$(now)
	rm -rf "$work/native-$r"
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "native\t0\t%.3f\t%.3f\t0\n", (b - a) / 1e9, (b - a) / 1e9 >> "'"$results"'"
		printf "  rep %d native  copy + sync %6.3f s\n", '"$r"', (b - a) / 1e9 }'
}

for r in $(seq 1 "$reps"); do
	echo "== repetition $r of $reps"
	native "$r"
	# Alternate the order of the systems from one repetition to the next.
	order=("${labels[@]}")
	if ((r % 2 == 0)); then
		order=()
		for ((i = ${#labels[@]} - 1; i >= 0; i--)); do order+=("${labels[$i]}"); done
	fi
	for l in "${order[@]}"; do run "$l" "$r"; done
done

echo
echo "$tool, medians of $reps ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)):"
awk -F'\t' "$MEDIAN_AWK"'
	{ k = $1; if (!(k in c)) order[++no] = k; c[k]++; cpu[k, c[k]] = $2; w[k, c[k]] = $3; l[k, c[k]] = $4; kb[k, c[k]] = $5 }
	END {
		for (i = 1; i <= c["native"]; i++) a[i] = w["native", i]
		nat = median(a, c["native"])
		printf "  %-7s %14s %12s %14s %12s %14s %8s\n", "system", "CPU µs/file", "KiB/file", "copy+sync s", "ms/file", "until listed s", "ratio"
		for (o = 1; o <= no; o++) {
			k = order[o]
			for (i = 1; i <= c[k]; i++) { x[i] = cpu[k, i]; y[i] = w[k, i]; z[i] = l[k, i]; q[i] = kb[k, i] }
			mc = median(x, c[k]); mw = median(y, c[k]); ml = median(z, c[k]); mk = median(q, c[k])
			printf "  %-7s %14s %12s %14.3f %12.3f %14.3f %8.2f\n", k, (k == "native" ? "-" : sprintf("%.1f", mc)), (k == "native" ? "-" : sprintf("%.2f", mk)), mw, mw * 1000 / '"$n"', ml, nat / ml
		}
	}' "$results"
# pages LABEL: one untimed copy with binary LABEL under strace, then the
# pages it wrote to the kv database, by b-tree. A WAL frame is written as
# its 24-byte header (the page number, big-endian, first) and then the
# page; a checkpoint writes page P at offset (P-1) x page size of the
# database file.
pages() {
	local label=$1 b=$work/$1 data=$work/pages-$1 mnt=$work/pmnt-$1 pid st trace=$work/pages-$1.trace psize got
	mkdir -p "$data" && chmod 700 "$data"
	"$b" --data "$data" ns create bench >/dev/null
	mountfs "$b" "$mnt" --data "$data" mount
	pid=$(<"$mnt.pid")
	strace -f -qq -p "$pid" -e trace=pwrite64 -y -s 4 -xx -o "$trace" &
	st=$!
	# strace prints its attach only with -q off; wait for a first trace line
	# instead: a put of its own, outside the copy.
	printf probe >"$mnt/bench/incoming/probe"
	for _ in $(seq 1 100); do [[ -s $trace ]] && break; sleep 0.05; done
	[[ -s $trace ]] || { echo "$PROG: strace recorded nothing 5 s after attaching to $pid" >&2; exit 1; }
	wc -l <"$trace" >"$trace.skip"
	copy "$mnt/bench/incoming/s"
	for _ in $(seq 1 600); do
		got=$(listed "$b" "$data")
		((got >= n + 1)) && break
		sleep 0.05
	done
	kill "$st"; wait "$st" 2>/dev/null || true
	umountfs "$mnt"
	psize=$(sqlite3 "$data/kv.db" 'PRAGMA page_size')
	tail -n +"$(($(<"$trace.skip") + 1))" "$trace" | python3 -c '
import collections, re, subprocess, sys
n, db, psize, label = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
owner = {}
for line in subprocess.run(["sqlite3", db, "SELECT pageno, name, pagetype FROM dbstat"], capture_output=True, text=True, check=True).stdout.splitlines():
    p, name, kind = line.split("|")
    owner[int(p)] = name + " (" + kind + ")"
call = re.compile(r"pwrite64\(\d+<((?:\\x[0-9a-f]{2})+)>, \"((?:\\x[0-9a-f]{2})*)\"(?:\.\.\.)?, (\d+), (\d+)\)")
unhex = lambda h: bytes.fromhex(h.replace("\\x", ""))
wal, chk = collections.Counter(), collections.Counter()
for line in sys.stdin:
    m = call.search(line)
    if not m:
        continue
    path, head, size, off = unhex(m.group(1)).decode(), unhex(m.group(2)), int(m.group(3)), int(m.group(4))
    if path.endswith(".db-wal") and size == 24:
        wal[owner.get(int.from_bytes(head, "big"), "freed")] += 1
    elif path.endswith(".db") and size == psize:
        chk[owner.get(off // psize + 1, "freed")] += 1
print(f"\n{label}: pages written per file, by b-tree ({n} files, {psize}-byte pages)")
print("  %-40s %8s %11s" % ("b-tree", "WAL", "checkpoint"))
for k in sorted(set(wal) | set(chk), key=lambda k: -(wal[k] + chk[k])):
    print(f"  {k:40} {wal[k] / n:8.2f} {chk[k] / n:11.2f}")
tw, tc = sum(wal.values()), sum(chk.values())
print("  " + "total".ljust(40) + f" {tw / n:8.2f} {tc / n:11.2f}   = {(tw + tc) * psize / 1024 / n:.1f} KiB/file")
' "$n" "$data/kv.db" "$psize" "$label"
	rm -rf "$data" "$mnt"
}
if [[ -n $pages ]]; then
	for l in "${labels[@]}"; do pages "$l"; done
fi

[[ -n $profile ]] && echo "profiles in $profile (go tool pprof -top $profile/after.bin $profile/after.cpu.pprof; -sample_index=alloc_objects for the heap ones)"
exit 0
