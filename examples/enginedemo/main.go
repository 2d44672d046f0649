// Command enginedemo drives the Governor engine in memory and prints what it
// decided: a retry budget spent across a chain, and a shared pool split
// between two tenants by weight.
package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "enginedemo:", err)
		os.Exit(1)
	}
}

func run() error {
	e, err := engine.New(engine.Config{})
	if err != nil {
		return err
	}
	// The operator's configuration: a pool of 2 database slots shared by two
	// tenants, and a retry budget of 3 for every payments task.
	if _, err := e.SetCaps(engine.System, engine.RootID, engine.CapsEdit{Limits: map[string]int64{"db": 2}}, ""); err != nil {
		return err
	}
	payments, err := e.CreateNode(engine.System, engine.RootID, engine.NodeSpec{Name: "payments", Weight: 4,
		DefaultQuotas: map[string]int64{"retry": 3}}, "")
	if err != nil {
		return err
	}
	recon, err := e.CreateNode(engine.System, engine.RootID, engine.NodeSpec{Name: "reconciliation", Weight: 1}, "")
	if err != nil {
		return err
	}
	paySess, err := e.OpenSession(payments.ID, "demo-payments", time.Minute)
	if err != nil {
		return err
	}
	reconSess, err := e.OpenSession(recon.ID, "demo-recon", time.Minute)
	if err != nil {
		return err
	}

	fmt.Println("== a retry budget: every retry of checkout-42, at any layer, draws from one budget of 3")
	checkout, err := e.CreateNode(paySess, payments.ID, engine.NodeSpec{Name: "checkout-42"}, "")
	if err != nil {
		return err
	}
	for attempt := 1; attempt <= 5; attempt++ {
		err := e.Consume(paySess, checkout.ID, "retry", 1, "")
		var d *engine.Denial
		switch {
		case errors.As(err, &d):
			fmt.Printf("  retry %d: denied, %s is %d of %d on %q\n", attempt, d.Resource, d.Used, d.Limit, d.NodeName)
		case err != nil:
			return err
		default:
			fmt.Printf("  retry %d: allowed\n", attempt)
		}
	}

	fmt.Println("== a shared pool of 2: reconciliation queues 100 jobs, payments 20, weights 4:1")
	batch, err := e.CreateNode(reconSess, recon.ID, engine.NodeSpec{Name: "nightly"}, "")
	if err != nil {
		return err
	}
	type waiting struct {
		sess   engine.SessionID
		tenant string
		wait   *engine.Wait
	}
	var queue []waiting
	var held []engine.Grant
	holder := map[engine.LeaseID]engine.SessionID{}
	enqueue := func(sess engine.SessionID, node engine.NodeID, tenant string, n int) error {
		for range n {
			g, w, err := e.Acquire(sess, engine.AcquireRequest{Node: node, Class: "db"})
			if err != nil {
				return err
			}
			if w == nil {
				held, holder[g.Lease] = append(held, g), sess
				continue
			}
			queue = append(queue, waiting{sess, tenant, w})
		}
		return nil
	}
	if err := enqueue(reconSess, batch.ID, "reconciliation", 100); err != nil {
		return err
	}
	if err := enqueue(paySess, checkout.ID, "payments", 20); err != nil {
		return err
	}
	grants := map[string]int{}
	var order []byte
	for len(held) > 0 && len(order) < 25 {
		g := held[0]
		held = held[1:]
		if err := e.Release(holder[g.Lease], g.Lease, 10*time.Millisecond, false, ""); err != nil {
			return err
		}
		for i, q := range queue {
			select {
			case o := <-q.wait.C:
				if o.Err != nil {
					return o.Err
				}
				held, holder[o.Grant.Lease] = append(held, o.Grant), q.sess
				grants[q.tenant]++
				order = append(order, q.tenant[0])
				queue = append(queue[:i], queue[i+1:]...)
			default:
				continue
			}
			break
		}
	}
	fmt.Printf("  the next 25 grants, in order (p = payments, r = reconciliation): %s\n", order)
	fmt.Printf("  payments %d, reconciliation %d: payments is served 4:1 although it queued 5x fewer\n",
		grants["payments"], grants["reconciliation"])
	snap := e.Snapshot()
	fmt.Printf("== %d events recorded; a restart replays them to the same state\n", snap.Seq)
	return nil
}
