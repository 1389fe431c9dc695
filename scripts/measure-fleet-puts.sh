#!/usr/bin/env bash
# measure-fleet-puts.sh — do fleet puts scale with hosts? 1, 2 and 3 fleet
# mounts (--kv DSN --large pglo --fleet, each with its own --data, as
# separate hosts would be) of one PostgreSQL, 4 writers per mount, each
# writing N/4 distinct 4 KiB files into incoming/ (N per mount in all).
# Run it under scripts/pg.sh, with pg_stat_statements loaded:
#
#   ALKBLOBFS_PG_CONF="shared_preload_libraries = 'pg_stat_statements'" \
#     [BEFORE=/tmp/before/alkblobfs] [REPS=3] [N=4000] [MOUNTS="1 2 3"] \
#     scripts/pg.sh scripts/measure-fleet-puts.sh
#
# The binary measured is ALKBLOBFS_BIN (default bin/alkblobfs: run make
# build first); with BEFORE, that binary too, as "before", interleaved with
# it: every repetition runs each binary with each mount count in turn.
# Per run it prints
#
#   puts/s        files closed ÷ the time until every writer's last close
#                 returned (a close returns once its blob and intent have
#                 committed; links settle at RELEASE, waited for after)
#   srv ms/put    CPU of the PostgreSQL server (postmaster, backends and
#                 their reaped children, from /proc) ÷ puts
#   cli µs/put    CPU of the mount daemons (utime + stime) ÷ puts, which
#                 depends little on the machine's other load
#   stmt/put      pg_stat_statements calls ÷ puts (BEGIN and COMMIT count)
#   rt/put        TCP data segments the daemons sent to the server ÷ puts:
#                 the round trips (a pipelined batch is one)
#   xact/put      write transactions (transaction ids consumed) ÷ puts
#
# then the medians per binary and mount count, the ratios of 2 and 3
# mounts to 1, and the statements of the last repetition's largest run by
# total execution time (what the server spends its time on).
set -euo pipefail

[[ -n ${ALKBLOBFS_PG_DSN:-} ]] || { echo "run under scripts/pg.sh" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
after=${ALKBLOBFS_BIN:-$here/bin/alkblobfs}
before=${BEFORE:-}
reps=${REPS:-3}
n=${N:-4000}
counts=${MOUNTS:-1 2 3}
((n % 4 == 0)) || { echo "N must be a multiple of 4" >&2; exit 2; }
[[ -x $after ]] || { echo "no $after: run make build" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/alkblobfs-fleetputs.XXXXXX")
PROG=measure-fleet-puts.sh
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

psqlc() { psql "$ALKBLOBFS_PG_DSN" -qAt -c "$1"; }
psqlc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null 2>&1 || true
stmts=1
psqlc "SELECT pg_stat_statements_reset()" >/dev/null 2>&1 || {
	stmts=0
	echo "# pg_stat_statements is not loaded: no stmt/put (set ALKBLOBFS_PG_CONF, see above)"
}
port=$(psqlc "SHOW port")
# The postmaster of this server (the first line of postmaster.pid).
postmaster=$(head -n 1 "$(psqlc "SHOW data_directory")/postmaster.pid")
hz=$(getconf CLK_TCK)

# ticks PID... prints the CPU ticks (utime + stime) of the processes.
ticks() {
	local p t=0 s
	for p in "$@"; do
		s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
		s=${s##*) }
		t=$((t + $(awk '{ print $12 + $13 }' <<<"$s")))
	done
	echo "$t"
}

# server_ticks: the postmaster's own and reaped children's ticks, plus
# those of its live children (the backends).
server_ticks() {
	local s kids
	s=$(cat "/proc/$postmaster/stat")
	s=${s##*) }
	kids=$(awk -v pm="$postmaster" '$4 == pm { print $1 }' /proc/[0-9]*/stat 2>/dev/null | tr '\n' ' ')
	# shellcheck disable=SC2086
	echo $(($(awk '{ print $12 + $13 + $14 + $15 }' <<<"$s") + $(ticks $kids)))
}

# segs: data segments sent on every client connection to the server, one
# "localport count" line each.
segs() {
	ss -tinH state established "( dport = :$port )" |
		awk '/^[0-9]/ { split($3, a, ":"); lp = a[length(a)] } /data_segs_out:/ { for (i = 1; i <= NF; i++) if ($i ~ /^data_segs_out:/) { split($i, b, ":"); print lp, b[2] } }'
}

# writer DIR TAG COUNT writes COUNT distinct 4096-byte files into DIR with
# bash builtins (no fork per file); each redirection's close publishes.
writer() {
	local dir=$1 tag=$2 count=$3 i s
	for ((i = 0; i < count; i++)); do
		s="$tag.$i."
		printf '%s' "$s${pad:${#s}}" >"$dir/$tag.$i" || return 1
	done
}
pad=$(head -c 3072 /dev/urandom | base64 -w0)

results=$work/results
: >"$results"

# run LABEL BIN MOUNTS ID
run() {
	local lab=$1 bin=$2 nm=$3 id=$4 i w ns per=$((n / 4)) total t0 secs
	local mnts=() wpids=() dpids=() c0 c1 s0 s1 x0 x1 q=0 rt
	total=$((n * nm)) ns=p$id
	"$bin" --kv "$ALKBLOBFS_PG_DSN" --large pglo --fleet --data "$work/$id.cli" ns create "$ns"
	for ((i = 0; i < nm; i++)); do
		mnts+=("$work/$id.m$i")
		mountfs "$bin" "${mnts[i]}" --kv "$ALKBLOBFS_PG_DSN" --large pglo --fleet --data "$work/$id.d$i" mount
		dpids+=("$(<"${mnts[i]}.pid")")
	done
	((stmts)) && psqlc "SELECT pg_stat_statements_reset()" >/dev/null
	x0=$(psqlc "SELECT txid_current()")
	segs >"$work/segs0"
	s0=$(server_ticks)
	c0=$(ticks "${dpids[@]}")
	t0=$(date +%s%N)
	for ((i = 0; i < nm; i++)); do
		for ((w = 0; w < 4; w++)); do
			writer "${mnts[i]}/$ns/incoming" "$id.m$i.w$w" "$per" &
			wpids+=("$!")
		done
	done
	for w in "${wpids[@]}"; do
		wait "$w" || die "$lab: a writer failed"
	done
	secs=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.4f", (b - a) / 1e9 }')
	# The links settle at each file's last RELEASE, just after its close.
	for _ in $(seq 1 600); do
		[[ $(psqlc "SELECT count(*) FROM ns_pending") == 0 ]] && break
		sleep 0.05
	done
	c1=$(ticks "${dpids[@]}")
	s1=$(server_ticks)
	segs >"$work/segs1"
	x1=$(($(psqlc "SELECT txid_current()") - 1))
	if ((stmts)); then
		q=$(psqlc "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat%' AND query <> 'SELECT count(*) FROM ns_pending' AND query <> 'SELECT txid_current()'")
		psqlc "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric * 1000, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 100)
			FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%' ORDER BY total_exec_time DESC LIMIT 12" >"$work/top.$lab.$nm" 2>/dev/null || true
	fi
	rt=$(awk 'NR == FNR { a[$1] = $2; next } { d += $2 - ($1 in a ? a[$1] : 0) } END { print d + 0 }' "$work/segs0" "$work/segs1")
	for ((i = 0; i < nm; i++)); do
		umountfs "${mnts[i]}"
	done
	local got
	got=$("$bin" --kv "$ALKBLOBFS_PG_DSN" --large pglo --fleet --data "$work/$id.cli" ls "$ns" | grep -vc '^e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855$' || true)
	[[ $got == "$total" ]] || die "$lab $nm: $got blobs in $ns, want $total"
	awk -v lab="$lab" -v m="$nm" -v t="$total" -v s="$secs" -v c="$((c1 - c0))" -v sv="$((s1 - s0))" -v hz="$hz" -v q="$q" -v rt="$rt" -v x="$((x1 - x0))" 'BEGIN {
		printf "%s\t%d\t%.1f\t%.3f\t%.0f\t%.2f\t%.2f\t%.2f\n", lab, m, t / s, sv / hz * 1000 / t, c / hz * 1e6 / t, q / t, rt / t, x / t }' | tee -a "$results" |
		awk -F'\t' '{ printf "  %-7s %d mount(s)  %8s puts/s  srv %6s ms/put  cli %5s µs/put  stmt %5s  rt %5s  xact %5s /put\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
	rm -rf "$work/$id".*
}

bins=(after)
[[ -n $before ]] && bins=(before after)
echo "# fleet puts: $n × 4 KiB per mount, 4 writers per mount, mounts: $counts; $(nproc) CPUs shared by PostgreSQL, the mounts and the writers; load $(cut -d' ' -f1-3 /proc/loadavg); REPS=$reps"
for ((rep = 1; rep <= reps; rep++)); do
	echo "# repetition $rep"
	for m in $counts; do
		for b in "${bins[@]}"; do
			bin=$after
			[[ $b == before ]] && bin=$before
			run "$b" "$bin" "$m" "r${rep}$b$m"
		done
	done
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# medians of $reps"
awk -F'\t' "$MEDIAN_AWK"'
	{ k = $1 "\t" $2; if (!(k in n)) order[++K] = k; n[k]++; for (f = 3; f <= 8; f++) v[k, f, n[k]] = $f }
	END {
		printf "%-7s %6s %9s %7s %12s %12s %8s %7s %8s\n", "binary", "mounts", "puts/s", "× one", "srv ms/put", "cli µs/put", "stmt/put", "rt/put", "xact/put"
		for (i = 1; i <= K; i++) {
			k = order[i]
			for (f = 3; f <= 8; f++) { for (j = 1; j <= n[k]; j++) a[j] = v[k, f, j]; med[k, f] = median(a, n[k]) }
			split(k, kk, "\t")
			one = med[kk[1] "\t1", 3]
			printf "%-7s %6d %9.1f %7s %12.3f %12.0f %8.2f %7.2f %8.2f\n", kk[1], kk[2], med[k, 3], one ? sprintf("%.2f", med[k, 3] / one) : "-", med[k, 4], med[k, 5], med[k, 6], med[k, 7], med[k, 8]
		}
	}' "$results"
for f in "$work"/top.*; do
	[[ -e $f ]] || continue
	echo "# top statements by total time, ${f##*/top.} mount(s), last repetition: calls, total ms, mean µs, query"
	cat "$f"
done
