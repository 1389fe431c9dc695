#!/usr/bin/env bash
# s3.sh runs a command against throw-away S3 servers:
#
#	scripts/s3.sh go test -race ./...
#	scripts/s3.sh --install      # only build the server, if missing
#
# The server is versitygw (a real S3 implementation, here over a POSIX
# directory), built with `go install` from the Go module proxy into
# $(go env GOPATH)/bin the first time (about a minute), or taken from
# $ALKBLOBFS_VERSITYGW or PATH. s3.sh starts it on a free 127.0.0.1 port
# with a temporary directory, random credentials and a bucket — plus a
# second one for fault tests, which stop and restart it — runs the command
# with these variables set, then stops both servers and deletes the
# directory, on success, failure and interrupt:
#
#	ALKBLOBFS_S3_URL          s3://alkblobfs?endpoint=127.0.0.1:PORT&region=us-east-1&tls=false
#	                          (a --large URL; tests add a prefix of their own)
#	AWS_ACCESS_KEY_ID         the servers' random credentials
#	AWS_SECRET_ACCESS_KEY
#	ALKBLOBFS_REQUIRE_S3=1    tests that need S3 fail instead of skipping
#	ALKBLOBFS_S3_FAULT_URL    the fault server, same form
#	ALKBLOBFS_S3_FAULT_CTL    run "$ALKBLOBFS_S3_FAULT_CTL stop|start|restart"
#	ALKBLOBFS_S3_FAULT_LOCK   a file fault tests flock, so that two test
#	                          binaries never stop the fault server under
#	                          each other
#
# The exit status is the command's. The servers listen on loopback only,
# plain HTTP; curl creates the buckets.
set -euo pipefail

version=v1.8.0
module=github.com/versity/versitygw/cmd/versitygw

die() {
	echo "s3.sh: $*" >&2
	exit 1
}

# find_server prints the path of a versitygw binary, if there is one.
find_server() {
	local p
	for p in "${ALKBLOBFS_VERSITYGW:-}" "$(command -v versitygw 2>/dev/null || true)" "$(go env GOPATH 2>/dev/null)/bin/versitygw"; do
		if [[ -n $p && -x $p ]]; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# install builds the server into $(go env GOPATH)/bin. From a scratch
# directory: `go install pkg@version` must not see this module's go.mod.
install() {
	command -v go >/dev/null 2>&1 || die "no versitygw and no go to build it with"
	echo "s3.sh: building versitygw $version (once; about a minute)" >&2
	local d
	d=$(mktemp -d)
	(cd "$d" && GOFLAGS=-mod=mod GOWORK=off go install "$module@$version") || {
		rm -rf "$d"
		die "go install $module@$version failed"
	}
	rm -rf "$d"
}

server=$(find_server) || {
	install
	server=$(find_server) || die "versitygw not found after go install"
}
if [[ ${1:-} == --install ]]; then
	echo "s3.sh: versitygw at $server"
	exit 0
fi
if (($# == 0)); then
	echo "usage: $0 COMMAND [ARG...]   or   $0 --install" >&2
	exit 2
fi
command -v curl >/dev/null 2>&1 || die "curl is needed to create the bucket (scripts/ci-deps.sh installs it)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/alkblobfs-s3.XXXXXX")
chmod 700 "$tmp"

# stop_pid PIDFILE: kills the server whose pid the file holds (SIGKILL:
# its data is thrown away, and a graceful stop takes seconds), and waits.
stop_pid() {
	local f=$1 pid
	[[ -f $f ]] || return 0
	pid=$(cat "$f")
	rm -f "$f"
	kill -9 "$pid" 2>/dev/null || return 0
	for _ in $(seq 200); do
		alive "$pid" || return 0
		sleep 0.02
	done
}

# alive PID: the process exists and is not a zombie (a killed server whose
# parent, start.sh, is gone waits as one until something reaps it).
alive() {
	local st
	st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
	[[ -n $st && $st != Z ]]
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_pid "$tmp/main.pid"
	stop_pid "$tmp/fault.pid"
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Random credentials: S3 access keys are alphanumeric.
access=AK$(od -An -N9 -tx1 /dev/urandom | tr -d ' \n' | tr a-f A-F)
secret=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')
bucket=alkblobfs
region=us-east-1

# The fault server's start script: also what s3.sh itself uses to start
# both servers. start.sh NAME PORT starts the server on PORT with its data
# in $tmp/NAME, records its pid and waits (30 s at most) until it answers.
cat >"$tmp/start.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
name=\$1 port=\$2
mkdir -p "$tmp/\$name"
ROOT_ACCESS_KEY_ID='$access' ROOT_SECRET_ACCESS_KEY='$secret' \\
	setsid "$server" --quiet --port "127.0.0.1:\$port" --region $region posix "$tmp/\$name" \\
	>>"$tmp/\$name.log" 2>&1 </dev/null &
echo \$! >"$tmp/\$name.pid"
for _ in \$(seq 300); do
	st=\$(awk '{print \$3}' "/proc/\$(cat "$tmp/\$name.pid")/stat" 2>/dev/null) || st=Z
	if [[ \$st == Z ]]; then
		exit 1 # died: the port was taken, say
	fi
	if curl -s -o /dev/null "http://127.0.0.1:\$port/"; then
		exit 0
	fi
	sleep 0.05
done
echo "versitygw on port \$port not ready after 30 s" >&2
exit 1
EOF
chmod 755 "$tmp/start.sh"

# start NAME: starts a server on a free port and prints the port. A port
# found free can be taken before the server binds it, so on failure it
# tries another.
start() {
	local name=$1 port
	for _ in 1 2 3 4 5 6 7 8; do
		port=$((20000 + RANDOM % 40000))
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			continue # something listens there
		fi
		if "$tmp/start.sh" "$name" "$port"; then
			echo "$port"
			return 0
		fi
		stop_pid "$tmp/$name.pid"
	done
	tail -n 20 "$tmp/$name.log" >&2 || true
	return 1
}

# mkbucket PORT: CreateBucket, signed by curl (SigV4; the credentials go
# through stdin, not the command line).
mkbucket() {
	printf 'user = "%s:%s"\n' "$access" "$secret" |
		curl -sS -f -K - --aws-sigv4 "aws:amz:$region:s3" \
			-H 'x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' \
			-X PUT "http://127.0.0.1:$1/$bucket" >/dev/null
}

main_port=$(start main) || die "could not start versitygw (log above)"
fault_port=$(start fault) || die "could not start the fault versitygw (log above)"
mkbucket "$main_port" || die "could not create the bucket"
mkbucket "$fault_port" || die "could not create the fault server's bucket"

cat >"$tmp/fault-ctl" <<EOF
#!/usr/bin/env bash
# fault-ctl stop|start|restart: controls the fault test server (same port,
# same data).
set -euo pipefail
# stop kills the server outright, as a crash would (a graceful stop
# waits seconds for idle connections); what it had acknowledged is on disk.
stop() {
	[[ -f "$tmp/fault.pid" ]] || return 0
	pid=\$(cat "$tmp/fault.pid")
	rm -f "$tmp/fault.pid"
	kill -9 "\$pid" 2>/dev/null || return 0
	for _ in \$(seq 200); do
		st=\$(awk '{print \$3}' "/proc/\$pid/stat" 2>/dev/null) || return 0
		[[ -n \$st && \$st != Z ]] || return 0
		sleep 0.02
	done
}
start() {
	for _ in 1 2 3 4 5; do
		# The old socket may linger a moment after a stop.
		"$tmp/start.sh" fault $fault_port && return 0
		sleep 0.5
	done
	tail -n 20 "$tmp/fault.log" >&2
	return 1
}
case \${1:-} in
stop) stop ;;
start) start ;;
restart) stop; start ;;
*) echo "usage: \$0 stop|start|restart" >&2; exit 2 ;;
esac
EOF
chmod 755 "$tmp/fault-ctl"
: >"$tmp/fault.lock"

url() { echo "s3://$bucket?endpoint=127.0.0.1:$1&region=$region&tls=false"; }
export ALKBLOBFS_S3_URL=$(url "$main_port")
export ALKBLOBFS_S3_FAULT_URL=$(url "$fault_port")
export ALKBLOBFS_S3_FAULT_CTL="$tmp/fault-ctl"
export ALKBLOBFS_S3_FAULT_LOCK="$tmp/fault.lock"
export AWS_ACCESS_KEY_ID=$access
export AWS_SECRET_ACCESS_KEY=$secret
export ALKBLOBFS_REQUIRE_S3=1
echo "s3.sh: versitygw $version on 127.0.0.1:$main_port (fault server :$fault_port), bucket $bucket" >&2

set +e
"$@"
rc=$?
set -e
exit "$rc"
