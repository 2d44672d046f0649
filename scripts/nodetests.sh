#!/usr/bin/env bash
# nodetests.sh runs the Node.js client's tests (clients/node) against a
# governord built from this checkout. ./test.sh runs it after go test.
#
# It installs Node.js with apt-get when the machine has none (or one older
# than 18), installs the npm dependencies from the committed
# package-lock.json with `npm ci`, type-checks the TypeScript definitions,
# and runs `node --test`. The PostgreSQL guide test needs
# GOVERNOR_TEST_PG_DSN (scripts/testpg.sh exports it) and skips without it.
set -euo pipefail
cd "$(dirname "$0")/.."

node_major() { node -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }

if (($(node_major) < 18)) || ! command -v npm >/dev/null; then
	echo "nodetests: installing Node.js with apt-get" >&2
	sudo_cmd=()
	if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi
	"${sudo_cmd[@]}" apt-get update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq nodejs npm >/dev/null
fi
if (($(node_major) < 18)); then
	echo "nodetests: Node.js 18 or newer is needed, found $(node --version 2>&1)" >&2
	exit 1
fi

_nodetests_tmp=$(mktemp -d)
trap 'rm -rf "$_nodetests_tmp"' EXIT
go build -o "$_nodetests_tmp/governord" ./cmd/governord

cd clients/node
npm ci --no-audit --no-fund --loglevel=error
npx --no-install tsc -p test/types/tsconfig.json
# One file at a time: the session tests time heartbeats on a 2-core machine.
concurrency=()
if (($(node_major) >= 20)); then concurrency=(--test-concurrency=1); fi
GOVERNORD_BIN="$_nodetests_tmp/governord" node --test "${concurrency[@]}" test/*.test.js
