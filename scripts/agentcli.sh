#!/usr/bin/env bash
# agentcli.sh runs governor hook inside the real agent CLIs: Claude Code
# (@anthropic-ai/claude-code) and Codex (@openai/codex), each driven
# non-interactively against a scripted fake model with the hook installed as
# its PreToolUse hook (cmd/governor/hook_agentcli_test.go). ./test.sh runs it
# after go test, where those tests skip for want of the CLIs.
#
# It installs Node.js with apt-get when the machine has none (or one older
# than 18), the two CLIs from the committed package-lock.json in
# cmd/governor/testdata/agentcli with `npm ci` (two native binaries, about
# 760 MB unpacked), and runs the tests with GOVERNOR_TEST_AGENTCLI=1,
# which makes a missing CLI a failure instead of a skip. The CLIs talk only to
# the fake model and governord on loopback: their telemetry, update checks
# and plugin syncs are off.
set -euo pipefail
cd "$(dirname "$0")/.."

node_major() { node -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }

if (($(node_major) < 18)) || ! command -v npm >/dev/null; then
	echo "agentcli: installing Node.js with apt-get" >&2
	sudo_cmd=()
	if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi
	"${sudo_cmd[@]}" apt-get update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq nodejs npm >/dev/null
fi
if (($(node_major) < 18)); then
	echo "agentcli: Node.js 18 or newer is needed, found $(node --version 2>&1)" >&2
	exit 1
fi

(cd cmd/governor/testdata/agentcli && npm ci --no-audit --no-fund --loglevel=error)
GOVERNOR_TEST_AGENTCLI=1 go test -count=1 -timeout 15m -run 'TestHookIn' ./cmd/governor
