#!/usr/bin/env bash
# testpg-ctl.sh is a throwaway PostgreSQL (scripts/testpg.sh) that a test
# can restart: it prints "dsn=<DSN>" when the server is ready, then obeys
# lines on stdin:
#
#   restart   stop the server at once (pg_ctl -m immediate, as a crash would)
#             and start it again on the same port; answers "restarted"
#
# At end of input it stops the server and removes its files. The HA checker
# (hacheck/) runs it, so that its PostgreSQL restarts touch no other test's server.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/testpg.sh >&2
echo "dsn=$GOVERNOR_TEST_PG_DSN"
while read -r cmd; do
	case $cmd in
	restart)
		_testpg_stop_server
		_testpg_launch "$GOVERNOR_TEST_PG_PORT"
		echo restarted
		;;
	*) echo "unknown command: $cmd" >&2 ;;
	esac
done
