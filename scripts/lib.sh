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

# rec WORKLOAD SYSTEM SECONDS keeps one repetition's figure in $results
# (tab-separated) and prints it.
rec() {
	printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"
	printf '  %-34s %-28s %8.3f s\n' "$1" "$2" "$3"
}

# ddread FILE reads FILE through in 1 MiB reads.
ddread() { dd if="$1" of=/dev/null bs=1M; }
