#!/usr/bin/env bash
# pgbench.sh runs the pgwire benchmark (pgwire/bench): pgbench -S and the
# TPC-B-like test at 1, 8 and 32 clients against PostgreSQL directly, the
# pgwire proxy (passthrough, and governed with governord in memory and on
# SQLite) and pgbouncer in session mode. It is optional and slow (about 6
# minutes); ./test.sh does not run it. docs/pgwire.md holds the figures.
#
#   bash scripts/pgbench.sh                       # the full run
#   bash scripts/pgbench.sh -T 5 -clients 8       # flags go to the program
#   bash scripts/pgbench.sh -profile "$(mktemp -d)"   # also CPU profiles
#
# It starts a throwaway PostgreSQL (scripts/testpg.sh), installs pgbouncer
# with apt-get when it is missing and we are root (without it, the run goes
# on without the pgbouncer target), and removes everything when it exits.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

have_pgbouncer() {
	command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]
}

extra=()
if ! have_pgbouncer; then
	if [[ $(id -u) == 0 ]]; then
		echo "pgbench.sh: installing pgbouncer (apt-get install pgbouncer)" >&2
		export DEBIAN_FRONTEND=noninteractive
		if ! apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null; then
			apt-get update -qq >/dev/null || true
			apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null || true
		fi
	fi
	if ! have_pgbouncer; then
		echo "pgbench.sh: pgbouncer is not installed and could not be; running without it" >&2
		extra=(-no-pgbouncer)
	fi
fi
if [[ -x /usr/sbin/pgbouncer ]] && ! command -v pgbouncer >/dev/null 2>&1; then
	extra+=(-pgbouncer /usr/sbin/pgbouncer)
fi

# shellcheck source=testpg.sh
source scripts/testpg.sh

go build -o "$GOVERNOR_TEST_PG_DIR/pgwire-bench" ./pgwire/bench
"$GOVERNOR_TEST_PG_DIR/pgwire-bench" "${extra[@]}" "$@"
