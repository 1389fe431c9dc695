#!/usr/bin/env bash
# measure.sh — before/after measurements of one workload at a time, runs
# interleaved: the mount's read path (each first open of a blob writes a
# pin row), puts from one mount and from two mounts of one store, sweeps
# over a large pool (beside many foreign pin rows), the publish latency
# of cp + stat, and the Go benchmarks of Pin and of a renewal tick.
#
#   [BASE=TREE] [REPS=3] scripts/measure.sh MODE [ARGS]
#
#   cat [N]                 N (10000) distinct 4 KiB blobs put with the CLI
#                           into the default store, then read through a
#                           mount with cat: cold (fresh mount, page cache
#                           dropped), warm (second pass), warm after the
#                           first renewal tick (20 s after mounting, which
#                           drops the released rows), and cold/warm with 4
#                           parallel readers. Needs root and FUSE.
#   puts [N]                N (4000) distinct 4 KiB files written into
#                           incoming/ by 4 writers on one mount, then by 2
#                           writers on each of two mounts of the same
#                           --data; timed until every writer's last close
#                           returned (close returns once published). With
#                           ALKBLOBFS_PG_DSN set (run it under scripts/pg.sh)
#                           the same on PostgreSQL fleet mode (--kv DSN
#                           --large pglo --fleet). With BASE, BASE's one
#                           mount too (label before-one; it refuses two).
#   sweep [N] [FRAC] [PINS] two sweeps of `alkblobfs sweep`, wall time and
#                           peak RSS (/usr/bin/time) and the sweep's own
#                           report, over an N (1000000) entry pool made by
#                           scripts/mkpool, FRAC (0.1) linked; then exactly
#                           the linked blobs must remain. PINS (100000)
#                           unexpired gc_pins rows of a foreign owner are
#                           present, 0 for none (scripts/mkpool -pins: their
#                           digests are of no pool blob, so the sweeps do
#                           the same deletes and only the table differs).
#                           With BASE, BASE's run has no pin rows (it has no
#                           table).
#   publish [N]             what a user's `cp f incoming/ && stat ns/DIGEST`
#                           costs: N (1000) distinct 4 KiB files, each copied
#                           in and then stat'ed by digest, one after the
#                           other; before and after interleaved file by
#                           file. Prints the median and 90th percentile in
#                           µs (REPS does not apply: every file is one).
#   verify [MB]             the read cost of each --verify mode: one blob of
#                           MB (1024) MiB read with dd through mounts in
#                           --verify=full, strict and publish, and natively
#                           from its backing file, interleaved; cold (page
#                           cache dropped, fresh mount: full verifies
#                           through the daemon), second (right after: full
#                           may still be in page-cached mode, its first
#                           handle's release in flight) and warm (third:
#                           full and publish pass through, strict reads
#                           through the daemon again). Then the scrub: wall
#                           time and the daemon's CPU time for
#                           `echo run > .alkblobfs/scrub` unpaced
#                           (--scrub-rate 0) and at --scrub-rate 100.
#                           Ratios are native time / mount time.
#   bench                   go test -bench 'Pin|Renew' ./store
#                           (store/pins_bench_test.go), -count REPS,
#                           -benchtime BENCHTIME (2s); the PostgreSQL ones
#                           run under scripts/pg.sh and skip otherwise.
#
# The binaries are built from the tree this script lives in ("after") and,
# with BASE set, from BASE ("before"; e.g. BASE=/tmp/base, a checkout of
# an older commit with the same layout). Each measurement is repeated REPS
# times, before and after interleaved, and every repetition is printed,
# then the medians and the after/before ratios. Everything (data, mounts,
# daemons) lives in a temporary directory removed on exit.
#
# Examples:
#   BASE=/tmp/base scripts/measure.sh cat
#   scripts/pg.sh scripts/measure.sh puts
#   BASE=/tmp/base scripts/measure.sh sweep 1000000 0.1 100000
#   scripts/pg.sh scripts/measure.sh bench
set -euo pipefail

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

mode=${1:-}
[[ -n $mode ]] || usage
shift
reps=${REPS:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
base=${BASE:-}
if [[ -n $base ]]; then
	base=$(cd "$base" && pwd)
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/alkblobfs-measure.XXXXXX")
PROG=measure.sh
# shellcheck source=scripts/lib.sh
. "$here/scripts/lib.sh"
cleanup() {
	local rc=$? m p
	trap - EXIT INT TERM
	for m in "${mounts[@]}"; do
		if mountpoint -q "$m" 2>/dev/null; then
			umount -l "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true
		fi
	done
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() {
	echo "$PROG: $*" >&2
	exit 1
}

# build TREE DIR builds alkblobfs (and mkpool, for sweep) from TREE.
build() {
	local tree=$1 dir=$2
	mkdir -p "$dir"
	(cd "$tree" && go build -o "$dir/alkblobfs" ./cmd/alkblobfs)
	if [[ $mode == sweep ]]; then
		(cd "$tree" && go build -o "$dir/mkpool" ./scripts/mkpool)
	fi
}

# labels: "before" (BASE) when set, then "after" (this tree); interleaved.
labels=()
if [[ -n $base ]]; then
	labels+=(before)
	build "$base" "$work/before"
fi
labels+=(after)
build "$here" "$work/after"

now() { date +%s%N; }
# timed LABEL METRIC CMD...: runs CMD and records its seconds.
timed() {
	local lab=$1 metric=$2 t0
	shift 2
	t0=$(now)
	"$@"
	record "$lab" "$metric" "$(elapsed "$t0")"
}
# elapsed T0: seconds since T0 (from now), 3 decimals.
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'; }

# record LABEL METRIC VALUE keeps one repetition's figure and prints it.
record() {
	printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$work/results"
	printf '  %-10s %-28s %s\n' "$1" "$2" "$3"
}

# summary prints, per label and metric, every repetition and the median;
# then, per metric, the ratio of the medians after/before (or two/one).
summary() {
	echo "# medians over $reps repetitions"
	awk -F'\t' "$MEDIAN_AWK"'
		{
			k = $1 "\t" $2
			if (!(k in n)) { order[++m] = k }
			v[k, ++n[k]] = $3
		}
		END {
			for (i = 1; i <= m; i++) {
				k = order[i]; c = n[k]; list = ""
				for (j = 1; j <= c; j++) { a[j] = v[k, j]; list = list (j > 1 ? " " : "") v[k, j] }
				med = median(a, c)
				split(k, kl, "\t"); lab[i] = kl[1]; met[i] = kl[2]; md[kl[1], kl[2]] = med
				printf "  %-10s %-28s median %10.3f   (%s)\n", kl[1], kl[2], med, list
			}
			for (i = 1; i <= m; i++) {
				split("after/before two-mounts/one-mount pg-two/pg-one one-mount/before-one native/full native/strict native/publish", pairs, " ")
				for (p in pairs) {
					split(pairs[p], ab, "/")
					if (lab[i] == ab[1] && ((ab[2], met[i]) in md) && md[ab[2], met[i]] != 0)
						printf "  ratio %s %-28s %.3f\n", pairs[p], met[i], md[ab[1], met[i]] / md[ab[2], met[i]]
				}
			}
		}' "$work/results"
}

# ---- cat ----------------------------------------------------------------

# readall DIR PAR N: cat every blob of DIR with PAR readers; checks that
# N * 4096 bytes came out.
readall() {
	local dir=$1 par=$2 n=$3 got
	got=$(find "$dir" -maxdepth 1 -type f -name '[0-9a-f]*' -print0 |
		xargs -0 -P "$par" -n "$(((n + par - 1) / par))" cat | wc -c)
	[[ $got == $((n * 4096)) ]] || die "read $got bytes from $dir, want $((n * 4096))"
}

mode_cat() {
	local n=${1:-10000} lab bin data mnt rep t0 start
	[[ -w /proc/sys/vm/drop_caches ]] || die "cat needs root (drop_caches)"
	echo "# cat of $n distinct 4 KiB blobs through the mount, default store, $(nproc) CPUs, REPS=$reps"
	mkdir -p "$work/src"
	head -c "$((n * 4096))" /dev/urandom | split -b 4096 -a 6 - "$work/src/f"
	for lab in "${labels[@]}"; do
		bin=$work/$lab/alkblobfs
		data=$work/$lab/data
		"$bin" --data "$data" ns create bench
		t0=$(now)
		find "$work/src" -type f -print0 | xargs -0 -n 1000 "$bin" --data "$data" put --ns bench >/dev/null
		echo "  $lab: put $n files in $(elapsed "$t0") s"
	done
	for ((rep = 1; rep <= reps; rep++)); do
		echo "# repetition $rep"
		for lab in "${labels[@]}"; do
			bin=$work/$lab/alkblobfs
			data=$work/$lab/data
			mnt=$work/$lab/mnt
			# One reader.
			mountfs "$bin" "$mnt" --data "$data" mount
			start=$(now)
			dropcaches
			timed "$lab" "cat1-cold-s" readall "$mnt/bench" 1 "$n"
			timed "$lab" "cat1-warm-s" readall "$mnt/bench" 1 "$n"
			# After the first renewal tick (TTL/3 = 20 s after mounting with
			# the default --pin-ttl) the released rows are gone.
			sleep "$(awk -v s="$start" -v now="$(now)" 'BEGIN { w = 22 - (now - s) / 1e9; print (w > 0 ? w : 0) }')"
			timed "$lab" "cat1-warm-after-tick-s" readall "$mnt/bench" 1 "$n"
			umountfs "$mnt"
			# Four readers.
			mountfs "$bin" "$mnt" --data "$data" mount
			dropcaches
			timed "$lab" "cat4-cold-s" readall "$mnt/bench" 4 "$n"
			timed "$lab" "cat4-warm-s" readall "$mnt/bench" 4 "$n"
			umountfs "$mnt"
		done
	done
	summary
}

# ---- puts ---------------------------------------------------------------

# writer DIR TAG COUNT writes COUNT distinct 4096-byte files into DIR with
# bash builtins (no fork per file); each redirection's close publishes.
writer() {
	local dir=$1 tag=$2 count=$3 i s
	for ((i = 0; i < count; i++)); do
		s="$tag.$i."
		printf '%s' "$s${pad:${#s}}" >"$dir/$tag.$i" || return 1
	done
}

# putrun LABEL RUNID MOUNTS N GLOBALFLAGS...: MOUNTS (1 or 2) daemons, 4
# writers spread over them, N files in all; records files/s and checks
# that the namespace holds N blobs afterwards. Fleet (pg-*) daemons are
# separate hosts, so each gets its own --data; the embedded store's
# daemons share the --data in GLOBALFLAGS (that is the point).
putrun() {
	local lab=$1 id=$2 nm=$3 n=$4 bin=$work/after/alkblobfs i w t0 secs got
	shift 4
	[[ $lab == before-* ]] && bin=$work/before/alkblobfs
	local ns="p$id" per=$((n / 4)) wpids=() mnts=() cli=("$bin" "$@")
	[[ $lab == pg-* ]] && cli+=(--data "$work/$id.cli")
	"${cli[@]}" ns create "$ns"
	for ((i = 0; i < nm; i++)); do
		mnts+=("$work/$id.m$i")
		if [[ $lab == pg-* ]]; then
			mountfs "$bin" "${mnts[i]}" "$@" --data "$work/$id.d$i" mount
		else
			mountfs "$bin" "${mnts[i]}" "$@" mount
		fi
	done
	t0=$(now)
	for ((w = 0; w < 4; w++)); do
		writer "${mnts[w % nm]}/$ns/incoming" "$id.w$w" "$per" &
		wpids+=("$!")
	done
	for w in "${wpids[@]}"; do
		wait "$w" || die "$lab: a writer failed"
	done
	secs=$(elapsed "$t0")
	for ((i = 0; i < nm; i++)); do
		umountfs "${mnts[i]}"
	done
	# The empty blob is not counted: concurrent `> name` writers sometimes
	# publish one (a FLUSH before the first write), before and after pins.
	"${cli[@]}" ls "$ns" >"$work/ls.out"
	got=$(grep -vc "^$empty\$" "$work/ls.out" || true)
	[[ $got == $((per * 4)) ]] || die "$lab: $got blobs in $ns, want $((per * 4))"
	grep -q "^$empty\$" "$work/ls.out" && echo "  ($lab: the empty blob was published too)"
	record "$lab" "puts-per-s" "$(awk -v n="$got" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')"
}

# empty is the digest of no bytes.
empty=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855

mode_puts() {
	local n=${1:-4000} rep data
	((n % 4 == 0)) || die "puts: N must be a multiple of 4"
	# 4096 bytes of text; each file's own prefix makes it distinct.
	pad=$(head -c 3072 /dev/urandom | base64 -w0)
	((${#pad} == 4096)) || die "pad is ${#pad} bytes"
	echo "# puts of $n distinct 4 KiB files into incoming/, 4 writers, $(nproc) CPUs, REPS=$reps"
	for ((rep = 1; rep <= reps; rep++)); do
		echo "# repetition $rep"
		if [[ -n $base ]]; then
			putrun before-one "r${rep}z" 1 "$n" --data "$work/r$rep.before"
		fi
		data=$work/r$rep.one
		putrun one-mount "r${rep}a" 1 "$n" --data "$data"
		data=$work/r$rep.two
		putrun two-mounts "r${rep}b" 2 "$n" --data "$data"
		rm -rf "$work/r$rep".*
	done
	if [[ -n ${ALKBLOBFS_PG_DSN:-} ]]; then
		echo "# PostgreSQL fleet mode (--kv DSN --large pglo --fleet)"
		for ((rep = 1; rep <= reps; rep++)); do
			echo "# repetition $rep"
			putrun pg-one "r${rep}c" 1 "$n" --kv "$ALKBLOBFS_PG_DSN" --large pglo --fleet
			putrun pg-two "r${rep}d" 2 "$n" --kv "$ALKBLOBFS_PG_DSN" --large pglo --fleet
		done
	else
		echo "# (ALKBLOBFS_PG_DSN is empty: no PostgreSQL runs; use scripts/pg.sh $0 puts)"
	fi
	summary
}

# ---- sweep --------------------------------------------------------------

mode_sweep() {
	local n=${1:-1000000} frac=${2:-0.1} npins=${3:-100000} rep lab bin data p linked i secs kib left
	local TIME=/usr/bin/time
	for tool in "$TIME" jq; do
		command -v "$tool" >/dev/null || die "$tool is missing"
	done
	echo "# two sweeps over $n entries ($frac linked), $npins foreign pin rows (after only), $(nproc) CPUs, REPS=$reps"
	for ((rep = 1; rep <= reps; rep++)); do
		echo "# repetition $rep"
		for lab in "${labels[@]}"; do
			bin=$work/$lab/alkblobfs
			data=$work/$lab/data
			p=()
			[[ $lab == after && $npins -gt 0 ]] && p=(-pins "$npins")
			"$work/$lab/mkpool" -data "$data" -n "$n" -link "$frac" -ns keep "${p[@]}"
			linked=$("$bin" --data "$data" ns ls -l | awk '$1 == "keep" { print $2 }')
			for i in 1 2; do
				"$TIME" -f '%e %M' -o "$work/time.out" "$bin" --data "$data" sweep --json >"$work/rep.json"
				read -r secs kib <"$work/time.out"
				record "$lab" "sweep$i-wall-s" "$secs"
				record "$lab" "sweep$i-peak-rss-MiB" "$(awk -v k="$kib" 'BEGIN { printf "%.1f", k / 1024 }')"
				record "$lab" "sweep$i-report-s" "$(jq '.duration_ns / 1e9 * 1000 | round / 1000' "$work/rep.json")"
				echo "  $lab sweep $i: $(jq -c '{scanned, candidates_queued, deleted, cancelled_by_arbitration, pins_reaped}' "$work/rep.json")"
			done
			left=$("$bin" --data "$data" ls | wc -l)
			[[ $left == "$linked" ]] || die "$lab: $left blobs left, want the $linked linked"
			rm -rf "$data"
		done
	done
	summary
}

# ---- bench --------------------------------------------------------------

mode_bench() {
	[[ -z $base ]] || echo "# (bench: BASE ignored, the benchmarks are new)"
	(cd "$here" && go test -run '^$' -bench "${BENCH:-Pin|Renew}" -benchtime "${BENCHTIME:-2s}" \
		-count "$reps" ./store) | tee "$work/bench.out"
	echo "# medians over -count $reps"
	awk "$MEDIAN_AWK"'$1 ~ /^Benchmark/ && $4 == "ns/op" { name = $1; c = ++n[name]; v[name, c] = $3; if (c == 1) order[++m] = name }
		END {
			for (i = 1; i <= m; i++) {
				k = order[i]; c = n[k]
				for (j = 1; j <= c; j++) a[j] = v[k, j]
				printf "  %-32s %14.0f ns/op\n", k, median(a, c)
			}
		}' "$work/bench.out"
}

# ---- verify ---------------------------------------------------------------

# cputicks PID: the process's user+system CPU time in clock ticks.
cputicks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

mode_verify() {
	local mb=${1:-1024} bin=$work/after/alkblobfs data=$work/data mnt=$work/mnt d backing rep m t0 c0 c1 secs
	[[ -z $base ]] || echo "# (verify: BASE ignored, the modes are compared with each other)"
	head -c "$((mb << 20))" /dev/urandom >"$work/blob"
	"$bin" --data "$data" ns create bench >/dev/null
	d=$("$bin" --data "$data" put --ns bench "$work/blob")
	rm "$work/blob"
	backing=$data/large/blobs/${d:0:2}/$d
	[[ -f $backing ]] || die "no backing file $backing"
	ddread() { dd if="$1" of=/dev/null bs=1M status=none; }
	for rep in $(seq 1 "$reps"); do
		echo "# repetition $rep"
		dropcaches
		timed native "cold read s" ddread "$backing"
		timed native "second read s" ddread "$backing"
		timed native "warm read s" ddread "$backing"
		for m in full strict publish; do
			mountfs "$bin" "$mnt" --data "$data" mount --verify="$m"
			dropcaches
			timed "$m" "cold read s" ddread "$mnt/bench/$d"
			timed "$m" "second read s" ddread "$mnt/bench/$d"
			timed "$m" "warm read s" ddread "$mnt/bench/$d"
			umountfs "$mnt"
		done
	done
	for rate in 0 100; do
		mountfs "$bin" "$mnt" --data "$data" mount --scrub-rate "$rate"
		for rep in $(seq 1 "$reps"); do
			c0=$(cputicks "$(<"$mnt.pid")")
			t0=$(now)
			echo run >"$mnt/.alkblobfs/scrub"
			secs=$(elapsed "$t0")
			c1=$(cputicks "$(<"$mnt.pid")")
			record "scrub-rate-$rate" "MB/s" "$(awk -v s="$secs" -v mb="$mb" 'BEGIN { printf "%.1f", mb * 1.048576 / s }')"
			record "scrub-rate-$rate" "CPU s per GiB" "$(awk -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v mb="$mb" 'BEGIN { printf "%.3f", c / hz / (mb / 1024) }')"
			record "scrub-rate-$rate" "CPU % of one core" "$(awk -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v s="$secs" 'BEGIN { printf "%.1f", 100 * c / hz / s }')"
		done
		umountfs "$mnt"
	done
	summary
}

mode_publish() {
	local n=${1:-1000} lab i d t0 t1
	mkdir -p "$work/src"
	for i in $(seq 1 "$n"); do
		head -c 4096 /dev/urandom >"$work/src/$i"
	done
	local -a sums
	mapfile -t sums < <(cd "$work/src" && for i in $(seq 1 "$n"); do sha256sum "$i"; done | cut -d' ' -f1)
	for lab in "${labels[@]}"; do
		"$work/$lab/alkblobfs" --data "$work/data-$lab" ns create ns >/dev/null
		mountfs "$work/$lab/alkblobfs" "$work/mnt-$lab" --data "$work/data-$lab" mount
	done
	for i in $(seq 1 "$n"); do
		d=${sums[i - 1]}
		for lab in "${labels[@]}"; do
			t0=${EPOCHREALTIME/./}
			cp "$work/src/$i" "$work/mnt-$lab/ns/incoming/" && stat -c %s "$work/mnt-$lab/ns/$d" >/dev/null ||
				die "$lab: file $i is not visible right after cp returned"
			t1=${EPOCHREALTIME/./}
			printf '%s\t%s\t%s\n' "$lab" "cp+stat µs" "$((t1 - t0))" >>"$work/results"
		done
	done
	awk -F'\t' '{ v[$1] = v[$1] " " $3 } END { for (l in v) print l, v[l] }' "$work/results" | while read -r lab vals; do
		echo "$vals" | tr ' ' '\n' | sort -n | awk -v l="$lab" '{ a[NR] = $1 } END { printf "  %-10s cp+stat µs  median %d  p90 %d  (%d files)\n", l, a[int((NR + 1) / 2)], a[int(NR * 0.9)], NR }'
	done
}

case $mode in
cat) mode_cat "$@" ;;
puts) mode_puts "$@" ;;
sweep) mode_sweep "$@" ;;
bench) mode_bench "$@" ;;
publish) mode_publish "$@" ;;
verify) mode_verify "$@" ;;
*) usage ;;
esac
