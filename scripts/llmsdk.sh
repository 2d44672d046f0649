#!/usr/bin/env bash
# llmsdk.sh runs the sidecar's tests that drive the official LLM SDKs (the
# openai and @anthropic-ai/sdk npm packages) to a fake provider
# (proxy/metering_sdk_test.go), through metered base-URL routes and, with
# no base URL, through intercepted tunnels. ./test.sh runs it after go test,
# where those tests skip for want of the SDKs.
#
# It installs Node.js with apt-get when the machine has none (or one older
# than 18), the SDKs and undici (for testdata/llmsdk/env-proxy.cjs) from the
# committed package-lock.json with `npm ci`, and runs the tests with
# GOVERNOR_TEST_LLMSDK=1, which makes a missing SDK a failure instead of a
# skip. The intercepted tests serve the fake on port 443 of a loopback
# address, as the providers' URLs name it: they need root,
# CAP_NET_BIND_SERVICE or net.ipv4.ip_unprivileged_port_start <= 443.
set -euo pipefail
cd "$(dirname "$0")/.."

node_major() { node -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }

if (($(node_major) < 18)) || ! command -v npm >/dev/null; then
	echo "llmsdk: installing Node.js with apt-get" >&2
	sudo_cmd=()
	if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi
	"${sudo_cmd[@]}" apt-get update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq nodejs npm >/dev/null
fi
if (($(node_major) < 18)); then
	echo "llmsdk: Node.js 18 or newer is needed, found $(node --version 2>&1)" >&2
	exit 1
fi

(cd proxy/testdata/llmsdk && npm ci --no-audit --no-fund --loglevel=error)
GOVERNOR_TEST_LLMSDK=1 go test -count=1 -run 'TestSDKs' ./proxy
