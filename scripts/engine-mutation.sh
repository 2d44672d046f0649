#!/bin/sh
# The mutation score of governor/engine, on demand (not in CI): every
# operator mutant of its source files, each built through go test -overlay
# and run against the randomized checker, then the whole package's tests.
# Arguments go to scripts/enginemutation (-files, -seeds, -ops, -parallel,
# -timeout, -out). It runs for a long time and keeps the cores busy: on a
# shared machine, run it under the shared lock for heavy jobs (flock).
set -eu
cd "$(dirname "$0")/.."
exec go run ./scripts/enginemutation "$@"
