// Command govbench runs Governor's benchmark and failure scenarios against
// real processes: governord and governor-proxy as an operator runs them,
// PostgreSQL, pgbouncer, Squid, tinyproxy, pgbench and wrk.
//
//	go run ./cmd/govbench [-out docs/bench] [-only NAMES] [-short] [-store memory|sqlite|postgres] [-runs 5] [-seed 1]
//	go run ./cmd/govbench sidecar [-T 10] [-rounds 3] [-out docs/bench]
//	go run ./cmd/govbench ha [-dsn DSN] [-failovers 50] [-T 10] [-rounds 3]   (ha.go; docs/ha.md)
//	go run ./cmd/govbench scaling [-seed 1] [-hours 1]   (scaling.go, a simulation; docs/scaling.md)
//	taskset -c 1 govbench fair -governord-cpu 0 [-store memory,sqlite,postgres] [-T 15s] [-ttl-run 60s] [-admission on|off]   (fair.go; docs/governord-performance.md)
//	bash scripts/sidecarbench.sh          (installs and starts what it needs)
//
// Without a subcommand it runs the numbered scenarios of docs/bench.md
// (bench.go), each against governords it builds and starts itself, and
// prints a table per scenario:
//
//   - fanout (fanout.go, on the virtual clock of sim.go): two tenants share
//     one downstream, without and with Governor;
//   - deadworker (deadworker.go): a worker dies holding the whole pool;
//   - adaptive (adaptive.go): the downstream's capacity drops, under a fixed
//     and an adaptive limit;
//   - retries (retries.go): nested retry loops against a downstream that is
//     down, without and with a retry budget;
//   - crash (crash.go): governord killed with SIGKILL under load and started
//     again on the same store (SQLite when -store is memory).
//
// go test ./cmd/govbench runs them in their -short form and checks the
// properties the figures rest on; ./test.sh runs that.
//
// Subcommands:
//
//   - sidecar: what the sidecar costs a worker. pgbench -S through pgwire at
//     8 and 32 clients against PostgreSQL directly, pgbouncer in session
//     mode, governor-proxy passing through (no rule matches SQL) and
//     governor-proxy governing every transaction (governord in memory and
//     on SQLite), and the relay floors (floors.go: a goroutine per
//     direction, one gnet event loop); wrk with 1 KiB responses over
//     keep-alive at 1 and 32 clients through bare goproxy, the HTTP floors
//     (net/http's and fasthttp's smallest forward proxies), the peers users
//     run (Squid and tinyproxy from Debian; peers.go) and governor-proxy
//     governing every request; and both contended (two tenants of
//     weights 3 and 1 behind their own sidecars, a pool smaller than the
//     clients), with each tenant's share. Runs are interleaved round by round so that the
//     machine's noise falls on every target alike, and reported as the
//     median and the range of the rounds. -profile records CPU profiles
//     of chosen targets under load with perf (sidecarpeers.go).
//
//   - fair: one tenant's flood (64 callers churning tasks) against another
//     tenant's latency (one caller, in a process of its own) on governord's
//     own API, with governord pinned to one core and the load to the
//     other; and a TTL run, the quiet tenant's sessions of 2 s through a
//     minute of flood (issue 27).
//
// Each scenario prints its tables and, with -out, writes its raw results as
// JSON there.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// scenarios are govbench's subcommands; the hidden ones serve the
// processes the scenarios start (an origin, a bare goproxy, the floors).
var scenarios = map[string]func(args []string, stdout, stderr io.Writer) int{
	"sidecar":        sidecarMain,
	"fair":           fairMain,
	"fair-quiet":     fairQuiet,
	"ha":             haMain,
	"scaling":        scalingMain,
	"plot":           plotMain,
	"serve-origin":   serveOrigin,
	"serve-goproxy":  serveGoproxy,
	"serve-nethttp":  serveNetHTTP,
	"serve-fasthttp": serveFastHTTP,
	"serve-relay":    serveRelay,
	"https-load":     httpsLoad,
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return benchMain(args, stdout, stderr)
	}
	if scenarios[args[0]] == nil {
		fmt.Fprintln(stderr, "usage: govbench [-out DIR] [-only NAMES] [-short] [-store memory|sqlite|postgres]   (govbench -h for the flags)")
		fmt.Fprintln(stderr, "       govbench sidecar [flags]   (govbench sidecar -h for the flags)")
		fmt.Fprintln(stderr, "       govbench plot [-in DIR] [-out DIR]   (draws docs/bench.md's figures from a run's JSON)")
		return 2
	}
	return scenarios[args[0]](args[1:], stdout, stderr)
}

// flagSet is a FlagSet that reports to stderr and exits 2 on bad flags.
func flagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("govbench "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
