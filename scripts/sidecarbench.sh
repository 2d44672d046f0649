#!/usr/bin/env bash
# sidecarbench.sh runs govbench's sidecar scenario: what governor-proxy costs
# a worker, side by side in one run (pgbench -S against PostgreSQL directly,
# pgbouncer, the relay floors, the sidecar passing through and governing;
# wrk against bare goproxy, the HTTP floors, Squid, tinyproxy and the
# sidecar governing; both contended). It is optional and slow (about 35
# minutes with the defaults); ./test.sh does not run it.
# docs/sidecar-performance.md holds the figures.
#
#   bash scripts/sidecarbench.sh                         # the full run
#   bash scripts/sidecarbench.sh -T 5 -rounds 1          # flags go to govbench
#   bash scripts/sidecarbench.sh -out docs/bench         # also the raw results as JSON
#   bash scripts/sidecarbench.sh -profile /tmp/prof      # also CPU profiles (perf) of some targets
#
# It starts a throwaway PostgreSQL (scripts/testpg.sh), installs pgbouncer,
# wrk, Squid and tinyproxy with apt-get when they are missing and we are
# root (Squid and tinyproxy are left out of the run when they cannot be),
# and removes everything when it exits.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || missing+=(pgbouncer)
command -v squid >/dev/null 2>&1 || [[ -x /usr/sbin/squid ]] || missing+=(squid)
command -v tinyproxy >/dev/null 2>&1 || missing+=(tinyproxy)
if ((${#missing[@]})) && [[ $(id -u) == 0 ]]; then
	echo "sidecarbench.sh: installing ${missing[*]} (apt-get)" >&2
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
		apt-get update -qq >/dev/null || true
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || true
	fi
fi
command -v wrk >/dev/null 2>&1 || { echo "sidecarbench.sh: wrk is not installed and could not be" >&2; exit 1; }

# shellcheck source=testpg.sh
source scripts/testpg.sh

go build -o "$GOVERNOR_TEST_PG_DIR/govbench" ./cmd/govbench
PATH="$PATH:/usr/sbin" "$GOVERNOR_TEST_PG_DIR/govbench" sidecar "$@"
