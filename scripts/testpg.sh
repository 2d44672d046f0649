#!/usr/bin/env bash
# testpg.sh starts a throwaway PostgreSQL for the tests and stops it, removing
# all its files, when the shell that sourced it exits. Source it; don't run it:
#
#   source scripts/testpg.sh && go test ./store/...     (./test.sh does this)
#
# It installs the server with apt-get if it is missing (a fresh machine has
# only the repo), runs it as an unprivileged user (initdb and postgres refuse
# root), in a new temporary folder, on a free port on 127.0.0.1, with fsync on
# so that durability tests mean something. It exports:
#
#   GOVERNOR_TEST_PG_DSN   postgres://governor:governor@127.0.0.1:PORT/governor?sslmode=disable
#                          (governor is a superuser; password auth, scram-sha-256)
#   GOVERNOR_TEST_PG_BIN   the server's bin folder: psql, pgbench, pg_ctl, ...
#   GOVERNOR_TEST_PG_DIR   the temporary folder: data/, the unix socket, server.log
#   GOVERNOR_TEST_PG_PORT  the TCP port
#   GOVERNOR_TEST_PG_CA    the server's self-signed TLS certificate (CN localhost,
#                          SAN 127.0.0.1), when openssl is there to make one;
#                          then the server also accepts TLS (ssl = on)
#
# Besides the superuser it creates login roles for each password method,
# for the pgwire proxy's tests: gov_md5/md5pass (md5), gov_scram/scrampass
# (scram-sha-256), gov_password/cleartextpass (password, i.e. cleartext) and
# gov_trust (trust), all on 127.0.0.1.
#
# To add roles with other auth methods (md5, scram) or TLS, extend the three
# lists below: pg_hba.conf lines (first match wins, so put a role's own line
# before the catch-all), server settings, and SQL run once as the superuser.
#
# It runs inside test.sh's `set -euo pipefail`, so every step checks its own
# errors and every variable and function it leaves behind starts with _testpg.

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	echo "testpg.sh: source this script (source scripts/testpg.sh); don't run it" >&2
	exit 2
fi

# pg_hba.conf, in order. The unix socket is in a private folder, so trust there.
_testpg_hba=(
	"local all all trust"
	"host  all gov_md5      127.0.0.1/32 md5"
	"host  all gov_password 127.0.0.1/32 password"
	"host  all gov_trust    127.0.0.1/32 trust"
	"host  all all 127.0.0.1/32 scram-sha-256"
	"host  all all ::1/128      scram-sha-256"
)

# postgresql.conf additions; the port is given on the command line.
_testpg_conf=(
	"listen_addresses = '127.0.0.1'"
	"max_connections = 200"
	"fsync = on"
	"synchronous_commit = on"
	"password_encryption = 'scram-sha-256'"
)

# SQL run once, as the superuser governor, after the server is up.
_testpg_setup_sql=(
	"CREATE DATABASE governor OWNER governor"
	"SET password_encryption = 'md5'; CREATE ROLE gov_md5 LOGIN PASSWORD 'md5pass'"
	"CREATE ROLE gov_scram LOGIN PASSWORD 'scrampass'"
	"CREATE ROLE gov_password LOGIN PASSWORD 'cleartextpass'"
	"CREATE ROLE gov_trust LOGIN"
)

# _testpg_tls makes a throwaway self-signed certificate in the data folder
# and turns TLS on, when openssl is installed; without it the server stays
# plain and GOVERNOR_TEST_PG_CA is not set.
_testpg_tls() {
	command -v openssl >/dev/null 2>&1 || return 0
	local d=$_testpg_dir/data
	if ! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
		-keyout "$d/server.key" -out "$d/server.crt" >"$_testpg_dir/openssl.log" 2>&1; then
		cat "$_testpg_dir/openssl.log" >&2 || true
		_testpg_fail "openssl could not make a certificate"
		return 1
	fi
	chmod 600 "$d/server.key" || return 1
	if ((${#_testpg_as[@]} > 0)); then
		chown postgres: "$d/server.key" "$d/server.crt" || return 1
	fi
	printf '%s\n' "ssl = on" "ssl_cert_file = 'server.crt'" "ssl_key_file = 'server.key'" >>"$d/postgresql.conf" || return 1
	_testpg_ca=$d/server.crt
}

_testpg_fail() {
	echo "testpg: $*" >&2
	if [[ -n "${_testpg_dir:-}" && -f "$_testpg_dir/server.log" ]]; then
		echo "testpg: last lines of the server log:" >&2
		tail -n 20 "$_testpg_dir/server.log" >&2 || true
	fi
}

# _testpg_find_bin prints the newest /usr/lib/postgresql/N/bin that has initdb.
_testpg_find_bin() {
	local d v best="" bestv=0
	for d in /usr/lib/postgresql/*/bin; do
		[[ -x "$d/initdb" ]] || continue
		v=${d#/usr/lib/postgresql/}
		v=${v%/bin}
		[[ "$v" =~ ^[0-9]+$ ]] || continue
		if ((v > bestv)); then
			best=$d
			bestv=$v
		fi
	done
	printf '%s' "$best"
}

_testpg_install() {
	if [[ $(id -u) != 0 ]]; then
		_testpg_fail "no PostgreSQL server in /usr/lib/postgresql/*/bin, and not root to install it: install the postgresql package"
		return 1
	fi
	echo "testpg: installing PostgreSQL (apt-get install postgresql)" >&2
	apt-get update -qq >/dev/null || { _testpg_fail "apt-get update failed"; return 1; }
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null ||
		{ _testpg_fail "apt-get install postgresql failed"; return 1; }
}

# _testpg_pick_user fills _testpg_as, the prefix that runs a command as the
# server's user: runuser to postgres when we are root, nothing otherwise.
_testpg_pick_user() {
	_testpg_as=()
	[[ $(id -u) == 0 ]] || return 0
	if ! id -u postgres >/dev/null 2>&1; then
		useradd --system --user-group --no-create-home --home-dir /nonexistent \
			--shell /usr/sbin/nologin postgres ||
			{ _testpg_fail "cannot create the postgres user"; return 1; }
	fi
	_testpg_as=(runuser -u postgres --)
}

# _testpg_port_free succeeds when nothing listens on 127.0.0.1:$1.
_testpg_port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# _testpg_launch starts the server on port $1 and waits until it accepts
# connections. It fails, with the server stopped, if the server exits first
# (say another process took the port in between).
_testpg_launch() {
	local port=$1 i
	# The subshell's cd keeps postgres from complaining about a working
	# folder it cannot read; exec keeps $! the server's (or runuser's) pid.
	(cd "$_testpg_dir" && exec "${_testpg_as[@]}" "$_testpg_bin/postgres" \
		-D "$_testpg_dir/data" -p "$port" -k "$_testpg_dir" >>"$_testpg_dir/server.log" 2>&1) &
	_testpg_pid=$!
	for ((i = 0; i < 600; i++)); do
		if "$_testpg_bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1; then
			return 0
		fi
		if ! kill -0 "$_testpg_pid" 2>/dev/null; then
			wait "$_testpg_pid" 2>/dev/null || true
			_testpg_pid=
			return 1
		fi
		sleep 0.1 # poll interval; the loop is bounded at about a minute
	done
	_testpg_fail "the server did not become ready within a minute"
	_testpg_stop_server
	return 1
}

_testpg_stop_server() {
	if [[ -n "${_testpg_pid:-}" ]]; then
		(cd / && "${_testpg_as[@]}" "$_testpg_bin/pg_ctl" -D "$_testpg_dir/data" -m immediate -w -s stop) >/dev/null 2>&1 ||
			kill -QUIT "$_testpg_pid" 2>/dev/null || true
		wait "$_testpg_pid" 2>/dev/null || true
		_testpg_pid=
	fi
}

# _testpg_cleanup runs at exit: stop the server, remove its folder.
_testpg_cleanup() {
	_testpg_stop_server || true
	if [[ -n "${_testpg_dir:-}" ]]; then
		rm -rf "$_testpg_dir" || true
	fi
}

# _testpg_chain_exit_trap installs _testpg_cleanup as the EXIT trap, followed
# by whatever EXIT trap the sourcing shell already had.
_testpg_trap_cmd() { _testpg_prev_exit=${3:-}; }
_testpg_chain_exit_trap() {
	local prev
	prev=$(trap -p EXIT)
	_testpg_prev_exit=
	eval "_testpg_trap_cmd $prev"
	trap '_testpg_cleanup; eval "$_testpg_prev_exit"' EXIT
}

_testpg_main() {
	local line sql port attempt version

	_testpg_bin=$(_testpg_find_bin)
	if [[ -z "$_testpg_bin" ]]; then
		_testpg_install || return 1
		_testpg_bin=$(_testpg_find_bin)
		[[ -n "$_testpg_bin" ]] || { _testpg_fail "postgresql installed, but no initdb in /usr/lib/postgresql/*/bin"; return 1; }
	fi
	_testpg_pick_user || return 1

	_testpg_dir=$(mktemp -d "${TMPDIR:-/tmp}/governor-pg.XXXXXX") || { _testpg_fail "mktemp failed"; return 1; }
	_testpg_pid=
	_testpg_chain_exit_trap
	if ((${#_testpg_as[@]} > 0)); then
		chown postgres: "$_testpg_dir" || { _testpg_fail "cannot chown $_testpg_dir"; return 1; }
	fi
	chmod 700 "$_testpg_dir" || return 1

	printf 'governor\n' >"$_testpg_dir/pwfile" && chmod 644 "$_testpg_dir/pwfile" || return 1
	# --no-sync: the cluster is thrown away; the running server keeps fsync on.
	if ! (cd "$_testpg_dir" && "${_testpg_as[@]}" "$_testpg_bin/initdb" -D "$_testpg_dir/data" \
		-U governor --pwfile="$_testpg_dir/pwfile" -E UTF8 --no-locale --no-sync \
		--auth-local=trust --auth-host=scram-sha-256 --no-instructions) >"$_testpg_dir/initdb.log" 2>&1; then
		cat "$_testpg_dir/initdb.log" >&2 || true
		_testpg_fail "initdb failed"
		return 1
	fi
	rm -f "$_testpg_dir/pwfile"

	# The files belong to the server's user; root may still write them.
	printf '%s\n' "${_testpg_hba[@]}" >"$_testpg_dir/data/pg_hba.conf" || return 1
	printf '%s\n' "${_testpg_conf[@]}" >>"$_testpg_dir/data/postgresql.conf" || return 1
	_testpg_ca=
	_testpg_tls || return 1

	port=
	for attempt in 1 2 3 4 5; do
		port=$((20000 + RANDOM % 40000))
		_testpg_port_free "$port" || continue
		if _testpg_launch "$port"; then
			break
		fi
		port=
	done
	[[ -n "$port" ]] || { _testpg_fail "the server did not start (5 ports tried)"; return 1; }

	for sql in "${_testpg_setup_sql[@]}"; do
		"$_testpg_bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$_testpg_dir" -p "$port" -U governor -d postgres -c "$sql" >/dev/null ||
			{ _testpg_fail "setup failed: $sql"; return 1; }
	done

	export GOVERNOR_TEST_PG_DSN="postgres://governor:governor@127.0.0.1:$port/governor?sslmode=disable"
	export GOVERNOR_TEST_PG_BIN=$_testpg_bin
	export GOVERNOR_TEST_PG_DIR=$_testpg_dir
	export GOVERNOR_TEST_PG_PORT=$port
	if [[ -n "$_testpg_ca" ]]; then
		export GOVERNOR_TEST_PG_CA=$_testpg_ca
	fi
	version=$("$_testpg_bin/postgres" --version 2>/dev/null) || true
	[[ "$version" =~ [0-9]+(\.[0-9]+)* ]] && version=${BASH_REMATCH[0]}
	echo "testpg: PostgreSQL $version on 127.0.0.1:$port (data, socket and log in $_testpg_dir); GOVERNOR_TEST_PG_DSN=$GOVERNOR_TEST_PG_DSN"
}

_testpg_main || return 1
