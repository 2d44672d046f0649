// Package hacheck checks governord with standbys (docs/ha.md) the way Jepsen
// checks a database: real governord processes over a real PostgreSQL,
// clients that record every call they make through the Go SDK, faults
// injected while they run (kill -9 of the leader, SIGSTOP past its lease
// and SIGCONT, a blackhole between the leader and PostgreSQL made by
// internal/faultproxy, a PostgreSQL restart), and then:
//
//   - the history checked for linearizability with porcupine against a
//     model of consume, acquire, release and validate (model_test.go);
//   - no acknowledged consume lost: the final count is at least what the
//     clients were told;
//   - no two holders of a limit-1 class at once, as judged by a downstream
//     that checks fencing tokens (downstream_test.go).
//
// The package holds only tests. A run is short by default (a few
// failovers, in ./test.sh); GOVERNOR_HA_FAILOVERS sets how many for a long
// run:
//
//	GOVERNOR_HA_FAILOVERS=50 go test -run TestFailovers -timeout 1h -v ./hacheck/
package hacheck
