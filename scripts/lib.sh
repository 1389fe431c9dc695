# lib.sh — what the measurement scripts share (bench.sh, bench-s3.sh, measure.sh).
# Source it after setting PROG (the script's name, for messages); the
# caller's cleanup stops the daemons in the `pids` array and unmounts the
# `mounts` array, which mountfs fills.

declare -a pids=() mounts=()

# mountfs BIN MNT ARGS... runs `BIN ARGS... MNT` in the background (ARGS
# end with the mount command and its flags), logging to MNT.log, and waits
# until the daemon serves.
mountfs() {
	local bin=$1 mnt=$2 pid
	shift 2
	mkdir -p "$mnt"
	"$bin" "$@" "$mnt" 2>"$mnt.log" &
	pid=$!
	pids+=("$pid")
	mounts+=("$mnt")
	echo "$pid" >"$mnt.pid"
	for _ in $(seq 1 2000); do
		grep -q 'msg=mounted' "$mnt.log" && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.01
	done
	echo "$PROG: mount on $mnt failed:" >&2
	cat "$mnt.log" >&2
	exit 1
}

# umountfs MNT stops its daemon, which unmounts, and waits for it to exit
# (its pin rows are dropped by then).
umountfs() {
	local mnt=$1 pid p keep=()
	pid=$(<"$mnt.pid")
	kill -TERM "$pid"
	wait "$pid" || { echo "$PROG: daemon on $mnt exited with $?:" >&2; cat "$mnt.log" >&2; exit 1; }
	for p in "${pids[@]}"; do
		[[ $p == "$pid" ]] || keep+=("$p")
	done
	pids=("${keep[@]}")
}

# dropcaches empties the page cache (root).
dropcaches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
}

# MEDIAN_AWK defines the awk function median(a, n): the median of
# a[1..n], which it sorts. Prepend it to an awk program.
MEDIAN_AWK='function median(a, n,   j, l, x) {
	for (j = 2; j <= n; j++) { x = a[j]; for (l = j - 1; l >= 1 && a[l] > x; l--) a[l + 1] = a[l]; a[l + 1] = x }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

# secs CMD... runs CMD and prints its wall time in seconds.
secs() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >/dev/null 2>&1
	t1=$(date +%s%N)
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", (b - a) / 1e9 }'
}

# rec WORKLOAD SYSTEM SECONDS [CPU [FILES [CS]]] keeps one repetition's
# figure in $results (tab-separated) and prints it; CPU is the daemon's CPU
# seconds over it, FILES the number of files it wrote (for CPU per file),
# CS the daemon's context switches over it.
rec() {
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" "${5:-}" "${6:-}" >>"$results"
	if [[ -z ${4:-} ]]; then
		printf '  %-38s %-28s %8.3f s\n' "$1" "$2" "$3"
	elif ((${5:-0} > 0)); then
		printf '  %-38s %-28s %8.3f s  daemon CPU %.2f s, %.0f us/file%s\n' "$1" "$2" "$3" "$4" "$(awk -v c="$4" -v f="$5" 'BEGIN { print c * 1e6 / f }')" \
			"${6:+, $(awk -v c="$6" -v f="$5" 'BEGIN { printf "%.1f", c / f }') context switches/file}"
	else
		printf '  %-38s %-28s %8.3f s  daemon CPU %.2f s\n' "$1" "$2" "$3" "$4"
	fi
}

# ddread FILE reads FILE through in 1 MiB reads.
ddread() { dd if="$1" of=/dev/null bs=1M; }

# rotation N R REPS prints the order (indices 0..N-1, space-separated) in
# which N systems run in repetition R of REPS: a row of a balanced Latin
# square (Williams design: the first row 0, 1, N-1, 2, N-2, ..., each next
# row adds 1 modulo N; for odd N the reversed rows follow). With REPS a
# multiple of the square's rows (N, or 2N for odd N) every system takes
# every position, and follows every other system, equally often; with
# fewer repetitions they take rows spread evenly over the square, so that
# the systems change places from one repetition to the next.
rotation() {
	awk -v n="$1" -v r="$2" -v reps="$3" 'BEGIN {
		rows = n % 2 ? 2 * n : n
		k = reps >= rows ? (r - 1) % rows : int((r - 1) * rows / reps)
		for (i = 0; i < n; i++) w[i] = i % 2 ? (i + 1) / 2 : (n - i / 2) % n
		for (i = 0; i < n; i++) {
			j = k < n ? i : n - 1 - i
			printf "%s%d", (i ? " " : ""), (w[j] + k) % n
		}
		print ""
	}'
}

# descendants PID prints PID and the ids of all its descendants, one a
# line (a juicefs mount serves from a child of the process started).
descendants() {
	local c
	echo "$1"
	for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do descendants "$c"; done
}

# cputicks PID prints the CPU time that PID and its descendants have used so
# far (utime + stime of all their threads, /proc/PID/stat), in clock ticks
# (getconf CLK_TCK a second).
cputicks() {
	local p t=0 v
	for p in $(descendants "$1"); do
		v=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null) || continue
		t=$((t + v))
	done
	echo "$t"
}

# ctxsw PID prints the context switches (voluntary and involuntary) that
# PID and its descendants have made so far, summed over their live threads
# (/proc/PID/task/TID/status: a process's own status counts its main
# thread only). A daemon's request loop sleeps in read(2) on /dev/fuse and
# wakes for each request, so they say how much of its CPU per file is
# hand-offs rather than work.
ctxsw() {
	local p t=0 v
	for p in $(descendants "$1"); do
		v=$(cat /proc/"$p"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }')
		t=$((t + v))
	done
	echo "$t"
}

# peakrss PID prints the largest peak resident set size (VmHWM) in KiB of
# PID and its descendants: that of the process that serves.
peakrss() {
	local p m=0 v
	for p in $(descendants "$1"); do
		v=$(awk '/^VmHWM:/ { print $2 }' "/proc/$p/status" 2>/dev/null) || continue
		((${v:-0} > m)) && m=$v
	done
	echo "$m"
}
