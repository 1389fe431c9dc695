#!/bin/bash
# measure-pg-statements.sh: the statements one fleet mount sends per put of a
# 4 KiB file (cp -r of N files into incoming/), from pg_stat_statements. Run:
#   ALKBLOBFS_PG_CONF="shared_preload_libraries = 'pg_stat_statements'" N=500 scripts/pg.sh scripts/measure-pg-statements.sh
set -e
B=${ALKBLOBFS_BIN:-$(dirname "$0")/../bin/alkblobfs}
psqlc() { psql "$ALKBLOBFS_PG_DSN" -qAt -c "$1"; }
psqlc "create extension if not exists pg_stat_statements" 2>/dev/null || echo "no pg_stat_statements"
M=$(mktemp -d); SRC=$(mktemp -d)
for i in $(seq 1 ${N:-500}); do head -c 4096 /dev/urandom > $SRC/f$i; done
$B --kv "$ALKBLOBFS_PG_DSN" --large pglo --fleet mount $M > $M.log 2>&1 &
for i in $(seq 100); do mountpoint -q $M && break; sleep 0.1; done
mkdir $M/ns1
c0=$(psqlc "select xact_commit from pg_stat_database where datname=current_database()")
psqlc "select pg_stat_reset()" >/dev/null
t0=$(date +%s.%N)
cp -r $SRC/. $M/ns1/incoming/
t1=$(date +%s.%N)
for i in $(seq 300); do n=$(ls $M/ns1 | grep -c '^[0-9a-f]\{64\}$' || true); [ "$n" -ge ${N:-500} ] && break; sleep 0.1; done
t2=$(date +%s.%N)
c1=$(psqlc "select xact_commit from pg_stat_database where datname=current_database()")
echo "files ${N:-500} cp $(echo "$t1-$t0"|bc) s, listed $(echo "$t2-$t0"|bc) s, commits $((c1-c0))"
psqlc "select calls, rows, round(total_exec_time::numeric,1), left(regexp_replace(query,'\s+',' ','g'),110) from pg_stat_statements order by calls desc limit 25" 2>/dev/null || true
umount $M; wait; rm -rf "$SRC"; rmdir "$M"
