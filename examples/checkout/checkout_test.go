package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestShortRun runs the example as CI does (go run ./examples/checkout
// -short) against the tests' PostgreSQL, and checks what it must show, not
// how fast: without Governor the batch crowds the gateway and checkouts
// fail; with Governor, with nothing changed in the services but their
// environment, the gateway never sees more than its capacity at once, turns
// nothing away, and no checkout fails, while the batch still gets work done.
func TestShortRun(t *testing.T) {
	if os.Getenv("GOVERNOR_TEST_PG_DSN") == "" {
		t.Skip("GOVERNOR_TEST_PG_DSN is unset (source scripts/testpg.sh; ./test.sh does)")
	}
	if testing.Short() {
		t.Skip("-short: the example runs four 3-second phases and builds five programs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	rep, err := run(ctx, shortRun, &out, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Logf("\n%s", out.String())
	if len(rep.Phases) != 4 {
		t.Fatalf("%d phases, want 4", len(rep.Phases))
	}
	for _, p := range rep.Phases {
		if p.Checkout.Requests == 0 {
			t.Errorf("%s, governor %v: no checkout was sent", p.Name, p.Governor)
		}
		if p.Batch && (p.Nightly == nil || p.Nightly.Paid == 0) {
			t.Errorf("%s, governor %v: the batch paid nothing (%+v)", p.Name, p.Governor, p.Nightly)
		}
	}
	for _, batch := range []bool{false, true} {
		if p := rep.find(false, batch); p.Gateway.Peak == 0 || p.Gateway.Served == 0 {
			t.Errorf("without Governor (batch %v): the gateway saw nothing: %+v", batch, p.Gateway)
		}
	}

	without, with := rep.find(false, true), rep.find(true, true)
	// The problem the example shows: the batch crowds the gateway out.
	if without.Gateway.Rejected == 0 || without.Checkout.failures() == 0 {
		t.Errorf("without Governor the batch did not crowd the gateway: it turned away %d, %d checkouts failed",
			without.Gateway.Rejected, without.Checkout.failures())
	}
	// Governor's answer: the gateway's capacity is a pool the tenants
	// share, so it is never exceeded, and the checkout gets its share.
	for _, batch := range []bool{false, true} {
		p := rep.find(true, batch)
		if p.Gateway.Peak > rep.PSPCapacity || p.Gateway.Rejected != 0 {
			t.Errorf("with Governor (batch %v): the gateway saw %d requests at once (capacity %d) and turned %d away",
				batch, p.Gateway.Peak, rep.PSPCapacity, p.Gateway.Rejected)
		}
		if p.Checkout.failures() != 0 {
			t.Errorf("with Governor (batch %v): %d of %d checkouts failed: %v", batch, p.Checkout.failures(), p.Checkout.Requests, p.Checkout.Failed)
		}
	}
	if with.Nightly.Got429 != 0 {
		t.Errorf("with Governor the batch was answered 429 %d times", with.Nightly.Got429)
	}
	if with.Checkout.failures() >= without.Checkout.failures() {
		t.Errorf("checkouts failed while the batch ran: %d with Governor, %d without", with.Checkout.failures(), without.Checkout.failures())
	}
	if !strings.Contains(out.String(), "with Governor") {
		t.Errorf("the table does not show the governed phases:\n%s", out.String())
	}
}
