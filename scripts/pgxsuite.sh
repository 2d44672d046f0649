#!/usr/bin/env bash
# pgxsuite.sh runs pgx's own test suite (the pgx v5 module go.mod names, from
# the Go module cache) against a throwaway PostgreSQL twice or more: directly,
# and through governor-proxy's pgwire listener, ungoverned and governed
# (`sql: any`). It fails when a test that passes directly fails, or is
# skipped, through the proxy, unless the test is listed, with its reason, as
# one a proxy cannot pass by its nature (pgwire/pgxsuite_test.go).
#
#   scripts/pgxsuite.sh             every package of pgx's module (what ./test.sh runs; 4 to 5 minutes)
#   scripts/pgxsuite.sh -short      pgx, pgconn, pgxpool and stdlib only (3 minutes)
#   scripts/pgxsuite.sh -v          later arguments go to the harness's go test
#
# The harness is TestPgxSuite in pgwire; it skips unless this script
# sets GOVERNOR_PGX_SUITE. The server is set up as pgx's CI does: its
# testsetup/postgresql_setup.sql (extensions, roles), its pg_hba.conf lines,
# and the certificates of its testsetup/generate_certs.go, in a server of
# scripts/testpg.sh's that is stopped and removed when this script exits.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages="github.com/jackc/pgx/v5/..."
if [[ "${1:-}" == "-short" ]]; then
	packages="github.com/jackc/pgx/v5 github.com/jackc/pgx/v5/pgconn github.com/jackc/pgx/v5/pgxpool github.com/jackc/pgx/v5/stdlib"
	shift
fi

pgx_dir=$(go list -m -f '{{.Dir}}' github.com/jackc/pgx/v5)
if [[ -z "$pgx_dir" || ! -f "$pgx_dir/testsetup/postgresql_setup.sql" ]]; then
	go mod download github.com/jackc/pgx/v5
	pgx_dir=$(go list -m -f '{{.Dir}}' github.com/jackc/pgx/v5)
fi
[[ -f "$pgx_dir/testsetup/postgresql_setup.sql" ]] || {
	echo "pgxsuite.sh: pgx's testsetup/ is not in the module cache ($pgx_dir)" >&2
	exit 1
}

# shellcheck source=testpg.sh
source scripts/testpg.sh

pg=$GOVERNOR_TEST_PG_DIR
data=$pg/data
psql_su=("$GOVERNOR_TEST_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$pg" -p "$GOVERNOR_TEST_PG_PORT" -U governor)

# pgx's certificates: a CA, the server's (localhost, 127.0.0.1) and pgx_sslcert's
# client certificate, its key encrypted with "certpw".
certs=$pg/pgx-certs
mkdir -p "$certs"
(cd "$certs" && go run "$pgx_dir/testsetup/generate_certs.go") >"$pg/pgx-certs.log" 2>&1 || {
	cat "$pg/pgx-certs.log" >&2
	echo "pgxsuite.sh: generate_certs.go failed" >&2
	exit 1
}
cp "$certs/localhost.crt" "$data/pgx-server.crt"
cp "$certs/localhost.key" "$data/pgx-server.key"
cp "$certs/ca.pem" "$data/pgx-root.crt"
chmod 600 "$data/pgx-server.key"
if [[ $(id -u) == 0 ]]; then
	chown postgres: "$data"/pgx-server.* "$data/pgx-root.crt"
fi

# pgx's pg_hba.conf lines for its roles, before testpg.sh's own.
hba=$(cat "$data/pg_hba.conf")
{
	echo "host    all pgx_md5     127.0.0.1/32 md5"
	echo "host    all pgx_scram   127.0.0.1/32 scram-sha-256"
	echo "host    all pgx_pw      127.0.0.1/32 password"
	echo "hostssl all pgx_ssl     127.0.0.1/32 scram-sha-256"
	echo "hostssl all pgx_sslcert 127.0.0.1/32 cert"
	printf '%s\n' "$hba"
} >"$data/pg_hba.conf"

"${psql_su[@]}" -d postgres \
	-c "ALTER SYSTEM SET ssl = on" \
	-c "ALTER SYSTEM SET ssl_cert_file = 'pgx-server.crt'" \
	-c "ALTER SYSTEM SET ssl_key_file = 'pgx-server.key'" \
	-c "ALTER SYSTEM SET ssl_ca_file = 'pgx-root.crt'" \
	-c "SELECT pg_reload_conf()" >/dev/null
# The postmaster reloads on its own time; new sessions show when it has.
for ((i = 0; ; i++)); do
	got=$("${psql_su[@]}" -d postgres -At -c "SHOW ssl_ca_file")
	[[ "$got" == pgx-root.crt ]] && break
	((i < 100)) || { echo "pgxsuite.sh: the server did not reload its config" >&2; exit 1; }
	sleep 0.1 # poll interval, bounded at 10 s
done
# pgx's CI cluster belongs to postgres, and some tests name that role.
"${psql_su[@]}" -d postgres -c "CREATE ROLE postgres SUPERUSER LOGIN" -c "CREATE DATABASE pgx_test" >/dev/null
"${psql_su[@]}" -d pgx_test -f "$pgx_dir/testsetup/postgresql_setup.sql" >/dev/null

export GOVERNOR_PGX_SUITE=$packages
export GOVERNOR_PGX_CERTS=$certs
echo "pgxsuite.sh: pgx $(go list -m -f '{{.Version}}' github.com/jackc/pgx/v5), packages: $packages"
go test -count=1 -timeout 60m -run '^TestPgxSuite$' ./pgwire "$@"
