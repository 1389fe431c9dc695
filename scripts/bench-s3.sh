#!/usr/bin/env bash
# bench-s3.sh — the optional remote rows of make bench: the mount with its
# large tier in S3, and in PostgreSQL large objects (pglo), with and
# without --cache, next to the same mount on the local large tier, on one
# machine, against the throw-away versitygw server of scripts/s3.sh and
# PostgreSQL server of scripts/pg.sh:
#
#   sudo scripts/pg.sh scripts/s3.sh scripts/bench-s3.sh
#   BENCH_SIZE_MB=256 BENCH_REPS=3 scripts/pg.sh scripts/s3.sh scripts/bench-s3.sh   # quick
#
# Without scripts/pg.sh (no ALKBLOBFS_PG_DSN) the pglo rows are left out.
#
#   write  cp of a BENCH_SIZE_MB file (distinct each repetition) into
#          incoming/ (publish: the upload, then the server-side copy)
#   read   dd of that blob, cold (page cache dropped, fresh mount) and warm
#          (the third read); local reads use passthrough, S3 reads ranged
#          GETs
#          for s3+cache the cold read is a fill: the put's copy (the
#          cp's scratch file, linked into the cache) is dropped first
#          (cache drop), so that it fetches the blob from S3
#          (pglo+cache likewise, from PostgreSQL)
#   again  dd of the blob after drop_caches and a remount: for s3+cache
#          and pglo+cache, a read of the --cache copy (the cold read
#          filled it). Both
#          systems read a local file in the same state: a new process
#          (so under --verify=full the first open reads through the
#          daemon, verifying, on both), nothing in the page cache
#          (sync, then drop_caches). Until the cache's directory was the
#          mount's passthrough probe (engines/cache Root) s3+cache always
#          read through the daemon and local could not be compared
#
# Systems: local (the local large tier), s3, s3+cache (s3 with --cache in
# the work directory, on its own prefix so that no put dedups against the
# s3 system's), pglo and pglo+cache (--kv on a database of their own each,
# --large pglo).
#
# Each workload runs BENCH_REPS times (default 3), interleaved across the
# systems; the table gives median, min and max seconds and MB/s of the
# median. The servers share the machine's CPUs and disk with the mount:
# the figures bound what the engine does, not what a remote server gives.
#
# Then the daemon's peak RSS (VmHWM of /proc/PID/status) after the cold
# read of a blob that fills the cache, for s3+cache and pglo+cache, with
# two blob sizes (BENCH_SIZE_MB/4 and BENCH_SIZE_MB) and two --cache-size
# (2x and 8x BENCH_SIZE_MB), each on a fresh mount with the cache dropped
# and the page cache emptied: the fill streams through fixed buffers, so
# it should not grow with either.
set -euo pipefail

size_mb=${BENCH_SIZE_MB:-1024}
reps=${BENCH_REPS:-3}
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ $(id -u) != 0 ]]; then
	echo "bench-s3.sh: run as root (drop_caches, FUSE)" >&2
	exit 1
fi
if [[ -z ${ALKBLOBFS_S3_URL:-} ]]; then
	echo "bench-s3.sh: no ALKBLOBFS_S3_URL: run it under scripts/s3.sh" >&2
	exit 1
fi

work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/alkblobfs-bench-s3.XXXXXX")
PROG=bench-s3.sh
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	{ grep -o " $work/[^ ]*" /proc/self/mountinfo || true; } | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	for db in "${pgdbs[@]}"; do psql "$ALKBLOBFS_PG_DSN" -qAt -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; done
	rm -rf "$work"
}
trap cleanup EXIT
bin=$work/alkblobfs
(cd "$root" && go build -o "$bin" ./cmd/alkblobfs)

# The bucket URL with a prefix of this run's own.
s3url=$(printf '%s' "$ALKBLOBFS_S3_URL" | sed -E "s|^s3://([^/?]+)[^?]*|s3://\\1/bench-$$|")
declare -A large=([local]="local:$work/local/large" [s3]="$s3url" [s3c]="${s3url/bench-$$/bench-$$-c}" [pglo]=pglo [pgloc]=pglo)
declare -A extra=([local]="" [s3]="" [s3c]="--cache $work/s3c/cache --cache-size 4GiB")
declare -A label=([local]=local [s3]=s3 [s3c]=s3+cache [pglo]=pglo [pgloc]=pglo+cache)
systems=(local s3 s3c)
cached=(s3c)
pgdbs=()
if [[ -n ${ALKBLOBFS_PG_DSN:-} ]]; then
	# A database of its own for each pglo system (kv and large objects).
	for s in pglo pgloc; do
		db=bench_${s}_$$
		psql "$ALKBLOBFS_PG_DSN" -qAt -c "CREATE DATABASE $db" >/dev/null
		pgdbs+=("$db")
		dsn=$(printf '%s' "$ALKBLOBFS_PG_DSN" | sed -E "s|^(postgres(ql)?://[^/]+)/[^?]*|\\1/$db|")
		extra[$s]="--kv $dsn"
	done
	extra[pgloc]+=" --cache $work/pgloc/cache --cache-size 4GiB"
	systems+=(pglo pgloc)
	cached+=(pgloc)
else
	echo "bench-s3.sh: no ALKBLOBFS_PG_DSN: the pglo rows are left out (run it under scripts/pg.sh too)" >&2
fi

results=$work/results
# mnt SYSTEM: mounts SYSTEM's store on $work/mnt-SYSTEM.
# shellcheck disable=SC2086 # extra is words
mnt() { mountfs "$bin" "$work/mnt-$1" --data "$work/$1" --large "${large[$1]}" ${extra[$1]} mount; }

echo "== sources ($size_mb MiB x $reps)"
head -c "$((size_mb << 20))" /dev/urandom >"$work/src.bin"
for r in $(seq 1 "$reps"); do
	cp "$work/src.bin" "$work/src-$r.bin"
	printf 'repetition %d' "$r" | dd of="$work/src-$r.bin" conv=notrunc status=none
done
nsys=${#systems[@]}
for s in "${systems[@]}"; do
	mkdir -p "$work/$s"
	chmod 700 "$work/$s"
	# shellcheck disable=SC2086
	"$bin" --data "$work/$s" --large "${large[$s]}" ${extra[$s]} ns create bench >/dev/null
done

for r in $(seq 1 "$reps"); do
	echo "== repetition $r of $reps"
	d=$(sha256sum "$work/src-$r.bin" | cut -c1-64)
	for i in $(seq 0 $((nsys - 1))); do
		s=${systems[$(((i + r - 1) % nsys))]}
		l=${label[$s]}
		mnt "$s"
		rec "cp $size_mb MiB into incoming/" "alkblobfs $l" "$(secs cp "$work/src-$r.bin" "$work/mnt-$s/bench/incoming/w-$r")"
		umountfs "$work/mnt-$s"
		if [[ -n ${extra[$s]} && ${extra[$s]} == *--cache* ]]; then
			# shellcheck disable=SC2086
			"$bin" --data "$work/$s" --large "${large[$s]}" ${extra[$s]} cache drop >/dev/null
		fi
		dropcaches
		mnt "$s"
		rec "read $size_mb MiB, cold" "alkblobfs $l" "$(secs ddread "$work/mnt-$s/bench/$d")"
		secs ddread "$work/mnt-$s/bench/$d" >/dev/null
		rec "read $size_mb MiB, warm" "alkblobfs $l" "$(secs ddread "$work/mnt-$s/bench/$d")"
		umountfs "$work/mnt-$s"
		dropcaches
		mnt "$s"
		rec "read $size_mb MiB, again" "alkblobfs $l" "$(secs ddread "$work/mnt-$s/bench/$d")"
		umountfs "$work/mnt-$s"
	done
done

# vmhwm MNT prints the peak RSS of MNT's daemon in MiB (lib.sh's peakrss).
vmhwm() { echo $(($(peakrss "$(<"$1.pid")") / 1024)); }

echo "== daemon memory"
rss=$work/rss
small_mb=$((size_mb / 4))
head -c "$((small_mb << 20))" /dev/urandom >"$work/rss-$small_mb.bin"
cp "$work/src.bin" "$work/rss-$size_mb.bin"
printf 'daemon memory' | dd of="$work/rss-$size_mb.bin" conv=notrunc status=none
for s in "${cached[@]}"; do
	base=${extra[$s]%--cache-size*}
	for mb in "$small_mb" "$size_mb"; do
		d=$(sha256sum "$work/rss-$mb.bin" | cut -c1-64)
		# shellcheck disable=SC2086 # extra is words
		"$bin" --data "$work/$s" --large "${large[$s]}" ${extra[$s]} put --ns bench "$work/rss-$mb.bin" >/dev/null
		for cs in $((size_mb * 2)) $((size_mb * 8)); do
			# shellcheck disable=SC2086
			"$bin" --data "$work/$s" --large "${large[$s]}" $base --cache-size "${cs}MiB" cache drop >/dev/null
			dropcaches
			# shellcheck disable=SC2086
			mountfs "$bin" "$work/mnt-$s" --data "$work/$s" --large "${large[$s]}" $base --cache-size "${cs}MiB" mount
			t=$(secs ddread "$work/mnt-$s/bench/$d")
			m=$(vmhwm "$work/mnt-$s")
			umountfs "$work/mnt-$s"
			printf '%s\t%s\t%s\t%s\t%s\n' "${label[$s]}" "$mb" "$cs" "$m" "$t" >>"$rss"
			printf '  %-12s blob %5d MiB  --cache-size %6d MiB  VmHWM %5d MiB  (cold read %.3f s)\n' "${label[$s]}" "$mb" "$cs" "$m" "$t"
		done
	done
done

echo
echo "alkblobfs bench, remote rows — $(uname -r), $(nproc) CPUs, $reps repetitions, interleaved; S3: versitygw on loopback; pglo: PostgreSQL on loopback$([[ -n ${ALKBLOBFS_PG_DSN:-} ]] || echo ' (not run)'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
awk -F'\t' -v mb="$size_mb" "$MEDIAN_AWK"'
	{
		k = $1 SUBSEP $2
		if (!(k in n)) { if (!($1 in seen)) { seen[$1] = 1; wl[++nw] = $1 } ; sys[$1, ++ns[$1]] = $2 }
		v[k, ++n[k]] = $3
	}
	END {
		printf "%-28s %-22s %9s %9s %9s %9s\n", "workload", "system", "median s", "min s", "max s", "MB/s"
		for (i = 1; i <= nw; i++) {
			w = wl[i]
			for (s = 1; s <= ns[w]; s++) {
				name = sys[w, s]; k = w SUBSEP name; c = n[k]; lo = ""; hi = ""
				for (j = 1; j <= c; j++) {
					x = v[k, j]; a[j] = x
					if (lo == "" || x < lo) lo = x
					if (hi == "" || x > hi) hi = x
				}
				med = median(a, c)
				printf "%-28s %-22s %9.3f %9.3f %9.3f %9.0f\n", w, name, med, lo, hi, (med > 0 ? mb * 1.048576 / med : 0)
			}
		}
	}' "$results"

echo
echo "daemon peak RSS (VmHWM) after a cold read that fills the cache"
awk -F'\t' '
	{ printf "%-12s blob %5d MiB  --cache-size %6d MiB  VmHWM %5d MiB\n", $1, $2, $3, $4 }' "$rss"
