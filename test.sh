#!/usr/bin/env bash
# test.sh runs every check and test Governor has, on a fresh machine.
#
# It installs and starts what the tests need by itself (a throwaway PostgreSQL
# in a temporary folder), then runs gofmt, go vet and go test, then the Node.js
# client's tests (scripts/nodetests.sh), then the client compatibility matrix
# (scripts/compat.sh), then pgx's own test suite through governor-proxy's
# pgwire listener (scripts/pgxsuite.sh).
# Extra arguments are passed to go test, e.g. ./test.sh -run TestRandomized -v,
# and leave the Node.js tests, the matrix and pgx's suite out.
set -euo pipefail
cd "$(dirname "$0")"

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files -co --exclude-standard '*.go') 2>/dev/null || true)
if [ -n "$unformatted" ]; then
	echo "gofmt: these files need formatting:" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "== go vet"
go vet ./...

if [ -x scripts/testpg.sh ]; then
	echo "== postgres"
	# testpg.sh prints the DSN of a fresh server and stops it when this shell exits.
	source scripts/testpg.sh
fi

# governor top is tested in a real terminal (cmd/governor's TestTopInTmux):
# tmux, installed here when missing, and required from then on.
echo "== tmux"
if ! command -v tmux >/dev/null 2>&1; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		sudo="sudo"
	fi
	$sudo apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
fi
export GOVERNOR_TEST_TMUX=1

echo "== go test"
go test -count=1 -timeout 20m "$@" ./...

# The Node.js client (clients/node) against a governord built from this
# checkout (under a minute). Only on a full run, like pgx's suite.
if (($# == 0)); then
	echo "== node client"
	bash scripts/nodetests.sh
fi

# The official OpenAI and Anthropic SDKs (npm) through the sidecar's metered
# routes to a fake provider (proxy/metering_sdk_test.go; npm ci from the
# committed lockfile, under a minute). Only on a full run.
if (($# == 0)); then
	echo "== LLM SDKs through metered routes"
	bash scripts/llmsdk.sh
fi

# governor hook inside the real Claude Code and Codex CLIs (npm ci from the
# committed lockfile), each run against a scripted fake model on loopback
# (cmd/governor/hook_agentcli_test.go; under two minutes). Only on a full
# run.
if (($# == 0)); then
	echo "== governor hook in Claude Code and Codex"
	bash scripts/agentcli.sh
fi

# The client compatibility matrix (compat/: PostgreSQL drivers through
# pgwire, HTTP clients through the forward proxy; docs/compatibility.md) and
# promtool's checks of deploy/'s alert rules. scripts/compat.sh installs the
# clients with apt-get and npm ci when missing (the matrix runs in under a
# minute). Only on a full run.
if (($# == 0)); then
	echo "== client compatibility matrix"
	bash scripts/compat.sh
fi

# pgx's own suite, its whole module, directly and through the pgwire proxy
# (4 to 5 minutes). Only on a full run: arguments pick tests of this
# repository's.
if (($# == 0)); then
	echo "== pgx's suite through pgwire"
	bash scripts/pgxsuite.sh
fi
