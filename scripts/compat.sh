#!/usr/bin/env bash
# compat.sh runs the client compatibility matrix (compat/) and checks the
# operator's alert rules with promtool. ./test.sh runs it on a full run.
#
# It installs what the matrix needs when the machine lacks it, from Debian
# (psycopg2, psycopg 3, requests, the PostgreSQL JDBC driver, a JDK, curl,
# Node.js, and promtool from the prometheus package) and from npm (pg,
# pg-copy-streams, undici, axios, with `npm ci` from the committed
# package-lock.json), starts a throwaway PostgreSQL (scripts/testpg.sh)
# unless GOVERNOR_TEST_PG_DSN names one, and runs the compat package's tests
# with GOVERNOR_COMPAT set. Those fail when docs/compatibility.md differs from
# what the run saw. The Java row of the intercepted-HTTPS table makes its
# truststore with the JDK's keytool.
#
#   scripts/compat.sh                           run and compare
#   GOVERNOR_COMPAT_WRITE=1 scripts/compat.sh   run and rewrite docs/compatibility.md
#                                               (a failing run too, its failures
#                                               shown as **FAIL**; it still fails)
#
# Later arguments go to go test (e.g. -v, -run TestDrivers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Debian's python3 is the one with Debian's psycopg; a python3 earlier on the
# PATH (pyenv, a virtualenv) may not have it.
export COMPAT_PYTHON=${COMPAT_PYTHON:-/usr/bin/python3}
export COMPAT_PGJDBC_JAR=${COMPAT_PGJDBC_JAR:-/usr/share/java/postgresql.jar}

missing=()
have_py() { [[ -x $COMPAT_PYTHON ]] && "$COMPAT_PYTHON" -c "import $1" 2>/dev/null; }
have_py psycopg2 || missing+=(python3-psycopg2)
have_py psycopg || missing+=(python3-psycopg)
have_py requests || missing+=(python3-requests)
[[ -f $COMPAT_PGJDBC_JAR ]] || missing+=(libpostgresql-jdbc-java)
# The JDK's source launcher runs the Java scripts: Java 11 or newer.
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null || (($(java_major || echo 0) < 11)); then missing+=(default-jdk-headless); fi
command -v curl >/dev/null || missing+=(curl)
command -v promtool >/dev/null || missing+=(prometheus)
node_major() { node -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }
if (($(node_major) < 18)) || ! command -v npm >/dev/null; then missing+=(nodejs npm); fi
if ((${#missing[@]} > 0)); then
	echo "compat: installing ${missing[*]} with apt-get" >&2
	sudo_cmd=()
	if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi
	"${sudo_cmd[@]}" apt-get update -qq
	# --no-install-recommends: prometheus would bring a web UI's worth of them.
	DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "compat: promtool check rules" >&2
promtool check rules deploy/prometheus/alerts.yaml
promtool test rules deploy/prometheus/alerts_test.yaml

(cd compat/node && npm ci --no-audit --no-fund --loglevel=error)

if [[ -z "${GOVERNOR_TEST_PG_DSN:-}" ]]; then
	# shellcheck source=testpg.sh
	source scripts/testpg.sh
fi

# The scripts are found relative to the package's folder, where go test runs.
GOVERNOR_COMPAT=1 go test -count=1 -timeout 10m "$@" ./compat/ ./deploy/
