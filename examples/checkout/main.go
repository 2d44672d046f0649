// Command checkout runs the checkout example: a checkout service and a
// nightly batch job that share one PostgreSQL and one payment gateway, first
// on their own and then under Governor, and prints what each side saw.
//
//	go run ./examples/checkout            # 10 s per phase, about a minute
//	go run ./examples/checkout -short     # 3 s per phase, as CI runs it
//
// The programs are ordinary Go services that know nothing of Governor:
//
//   - checkoutd (examples/checkout/checkoutd) takes POST /checkout, records
//     the order in PostgreSQL and charges it at the gateway, retrying twice
//     on 429;
//   - nightly (examples/checkout/nightly) sends pending payouts to the same
//     gateway from 24 workers, as fast as the gateway lets it;
//   - psp (examples/checkout/psp) is the gateway: it serves 8 requests at
//     once and answers 429 to any beyond.
//
// The driver runs four phases: the checkout alone, then with the batch
// running, first without Governor and then with it, sending the checkout a
// steady stream of orders and timing each. "With Governor" changes only the
// services' environment: HTTP_PROXY points at a governor-proxy next to each
// service, and DATABASE_URL at that proxy's pgwire listener. The proxies
// run on governor.yaml and proxy.yaml in this folder: the two services are
// two tenants of one governord, the gateway a pool of 8 slots, the batch
// capped at 4 of them and 4 of the database's 16, and the checkout weighted
// 4 to the batch's 1 when both wait.
//
// PostgreSQL comes from CHECKOUT_DATABASE_URL or GOVERNOR_TEST_PG_DSN (a
// postgres:// URL of a role that may create a schema); without either, the
// driver starts a throwaway server with scripts/testpg.sh, which installs
// PostgreSQL with apt-get where it is missing. The example's tables live in
// the schema checkout_example, which each run recreates.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	short := flag.Bool("short", false, "3-second phases at a lower rate, as CI runs it")
	jsonOut := flag.String("json", "", "also write the results to this file, as JSON")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "checkout: no arguments are taken, only flags")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := fullRun
	if *short {
		opts = shortRun
	}
	rep, err := run(ctx, opts, os.Stdout, os.Stderr)
	if err == nil && *jsonOut != "" {
		err = writeJSON(*jsonOut, rep)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkout:", err)
		os.Exit(1)
	}
}

// options size a run.
type options struct {
	Phase   time.Duration `json:"phase"`   // each phase's length
	Rate    int           `json:"rate"`    // checkouts per second
	Workers int           `json:"workers"` // the batch's workers
	Payouts int           `json:"payouts"` // pending payouts seeded before each batch run
}

var (
	fullRun  = options{Phase: 10 * time.Second, Rate: 40, Workers: 24, Payouts: 50000}
	shortRun = options{Phase: 3 * time.Second, Rate: 30, Workers: 24, Payouts: 20000}
)

func writeJSON(path string, rep *report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// run sets everything up, runs the four phases and prints the table to out;
// progress and the processes' trouble go to log.
func run(ctx context.Context, opts options, out, log io.Writer) (*report, error) {
	e, err := setUp(ctx, opts, log)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep := &report{Options: opts, PSPCapacity: e.capacity}
	for _, governed := range []bool{false, true} {
		phases, err := e.runMode(ctx, governed)
		if err != nil {
			return nil, err
		}
		rep.Phases = append(rep.Phases, phases...)
	}
	rep.print(out)
	return rep, nil
}
