#!/usr/bin/env bash
# pg.sh runs a command against throw-away PostgreSQL servers:
#
#	scripts/pg.sh go test -race ./...
#
# It initializes a cluster in a temporary directory, starts it on a free
# 127.0.0.1 port (plus a second copy for fault tests, which stop and restart
# their server), runs the command with these variables set, then stops both
# servers and deletes the directory — on success, failure and interrupt:
#
#	ALKBLOBFS_PG_DSN         postgres://alkblobfs:…@127.0.0.1:PORT/alkblobfs?sslmode=disable
#	ALKBLOBFS_REQUIRE_PG=1   tests that need PostgreSQL fail instead of skipping
#	ALKBLOBFS_PG_FAULT_DSN   the fault server, same form
#	ALKBLOBFS_PG_FAULT_CTL   run "$ALKBLOBFS_PG_FAULT_CTL stop|start|restart"
#	ALKBLOBFS_PG_FAULT_LOCK  a file fault tests flock, so that two test
#	                         binaries never restart the fault server under
#	                         each other
#	ALKBLOBFS_PG_OSUSER      the system user the servers run as (empty
#	                         when not started as root): a tablespace
#	                         directory a test makes must be this user's
#
# The exit status is the command's. The servers are for tests only: fsync is
# off (set ALKBLOBFS_PG_FSYNC=on to measure with it; ALKBLOBFS_PG_CONF adds
# a line of postgresql.conf, e.g. shared_preload_libraries =
# 'pg_stat_statements' to profile), the password is random
# per run, and they listen on loopback only. As root, the servers run as the
# "postgres" user if it exists, else "nobody" (postgres refuses to run as
# root). initdb, pg_ctl and postgres come from PATH or
# /usr/lib/postgresql/N/bin; scripts/ci-deps.sh installs them.
set -euo pipefail

if (($# == 0)); then
	echo "usage: $0 COMMAND [ARG...]" >&2
	exit 2
fi

die() {
	echo "pg.sh: $*" >&2
	exit 1
}

# find_bindir prints the directory of initdb, pg_ctl and postgres: PATH
# first, else Debian's /usr/lib/postgresql/N/bin (newest N).
find_bindir() {
	local d=""
	if command -v initdb >/dev/null 2>&1; then
		d=$(dirname "$(readlink -f "$(command -v initdb)")")
	else
		d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	fi
	[[ -n $d && -x $d/initdb && -x $d/pg_ctl && -x $d/postgres && -x $d/psql ]] && echo "$d"
}
bindir=$(find_bindir) || bindir=""
if [[ -z $bindir ]] && command -v apt-get >/dev/null 2>&1; then
	echo "pg.sh: no PostgreSQL server binaries; installing Debian's postgresql package" >&2
	sudo=()
	[[ $(id -u) == 0 ]] || sudo=(sudo)
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
	bindir=$(find_bindir) || bindir=""
fi
[[ -n $bindir ]] || die "no PostgreSQL server binaries (initdb, pg_ctl, postgres, psql): install Debian's postgresql package (scripts/ci-deps.sh does)"

# as_db runs a command as the unprivileged server user when we are root.
dbuser=""
if [[ $(id -u) == 0 ]]; then
	if id postgres >/dev/null 2>&1; then
		dbuser=postgres
	else
		dbuser=nobody
	fi
fi
as_db() {
	if [[ -n $dbuser ]]; then
		runuser -u "$dbuser" -- "$@"
	else
		"$@"
	fi
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/alkblobfs-pg.XXXXXX")
[[ -n $dbuser ]] && chown "$dbuser" "$tmp"
chmod 700 "$tmp"

servers=()
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	for d in "${servers[@]}"; do
		# -m immediate: the data is thrown away, nothing to flush.
		as_db "$bindir/pg_ctl" -D "$d" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
	done
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$password" >"$tmp/pwfile"
[[ -n $dbuser ]] && chown "$dbuser" "$tmp/pwfile"
as_db "$bindir/initdb" -D "$tmp/main" -U alkblobfs --pwfile="$tmp/pwfile" \
	--auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 \
	>"$tmp/initdb.log" 2>&1 || { cat "$tmp/initdb.log" >&2; die "initdb failed"; }
rm -f "$tmp/pwfile"
# The fault server is a copy: cheaper than a second initdb.
as_db cp -a "$tmp/main" "$tmp/fault"

fsync=${ALKBLOBFS_PG_FSYNC:-off}

# start DIR: starts the cluster in DIR on a free port and prints the port.
# A port found free can be taken before postgres binds it, so on failure it
# tries another.
start() {
	local dir=$1 port try
	for try in 1 2 3 4 5 6 7 8; do
		port=$((20000 + RANDOM % 40000))
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			continue # something listens there
		fi
		cat >"$tmp/$(basename "$dir").conf" <<-EOF
			port = $port
			listen_addresses = '127.0.0.1'
			unix_socket_directories = '$tmp'
			max_connections = 200
			fsync = $fsync
			synchronous_commit = $fsync
			full_page_writes = $fsync
			shared_buffers = 128MB
			log_min_messages = warning
			${ALKBLOBFS_PG_CONF:-}
		EOF
		as_db cp "$tmp/$(basename "$dir").conf" "$dir/postgresql.auto.conf"
		if as_db "$bindir/pg_ctl" -D "$dir" -l "$dir.log" -w -t 60 start >/dev/null 2>&1; then
			echo "$port"
			return 0
		fi
	done
	tail -n 20 "$dir.log" >&2 || true
	return 1
}

# ready PORT: waits (30 s at most) until the server accepts connections
# over TCP with the password, then creates the alkblobfs database.
ready() {
	local port=$1 deadline=$((SECONDS + 30))
	local psql=("$bindir/psql" -h 127.0.0.1 -p "$port" -U alkblobfs -d postgres -qAt)
	until PGPASSWORD=$password "${psql[@]}" -c 'SELECT 1' >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "server on port $port not ready after 30 s"
		sleep 0.1
	done
	PGPASSWORD=$password "${psql[@]}" -c 'CREATE DATABASE alkblobfs' >/dev/null
}

servers+=("$tmp/main")
main_port=$(start "$tmp/main") || die "could not start PostgreSQL (log above)"
servers+=("$tmp/fault")
fault_port=$(start "$tmp/fault") || die "could not start the fault PostgreSQL (log above)"
ready "$main_port"
ready "$fault_port"

cat >"$tmp/fault-ctl" <<EOF
#!/usr/bin/env bash
# fault-ctl stop|start|restart: controls the fault test server.
set -euo pipefail
case \${1:-} in
stop) mode=(-m fast) ;;
start) mode=(-l "$tmp/fault.log") ;;
restart) mode=(-m fast -l "$tmp/fault.log") ;;
*) echo "usage: \$0 stop|start|restart" >&2; exit 2 ;;
esac
if [[ -n "$dbuser" ]]; then
	exec runuser -u "$dbuser" -- "$bindir/pg_ctl" -D "$tmp/fault" "\${mode[@]}" -w -t 60 "\$1" >/dev/null
fi
exec "$bindir/pg_ctl" -D "$tmp/fault" "\${mode[@]}" -w -t 60 "\$1" >/dev/null
EOF
chmod 755 "$tmp/fault-ctl"
: >"$tmp/fault.lock"

export ALKBLOBFS_PG_DSN="postgres://alkblobfs:$password@127.0.0.1:$main_port/alkblobfs?sslmode=disable"
export ALKBLOBFS_PG_FAULT_DSN="postgres://alkblobfs:$password@127.0.0.1:$fault_port/alkblobfs?sslmode=disable"
export ALKBLOBFS_PG_FAULT_CTL="$tmp/fault-ctl"
export ALKBLOBFS_PG_FAULT_LOCK="$tmp/fault.lock"
export ALKBLOBFS_PG_OSUSER="$dbuser"
export ALKBLOBFS_REQUIRE_PG=1
echo "pg.sh: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$main_port (fault server :$fault_port), fsync=$fsync" >&2

set +e
"$@"
rc=$?
set -e
exit "$rc"
