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
	d, err := newDemo()
	if err != nil {
		return err
	}
	if err := d.retryBudget(); err != nil {
		return err
	}
	if err := d.sharedPool(); err != nil {
		return err
	}
	snap := d.e.Snapshot()
	fmt.Printf("== %d events recorded; a restart replays them to the same state\n", snap.Seq)
	return nil
}

// demo is an engine with the operator's configuration and a session of
// each tenant's.
type demo struct {
	e                  *engine.Engine
	payments, recon    engine.NodeView
	paySess, reconSess engine.SessionID
	checkout           engine.NodeView
}

// newDemo sets the operator's configuration up: a pool of 2 database slots
// shared by two tenants, and a retry budget of 3 for every payments task.
func newDemo() (*demo, error) {
	e, err := engine.New(engine.Config{})
	if err != nil {
		return nil, err
	}
	d := &demo{e: e}
	if _, err := e.SetCaps(engine.System, engine.RootID, engine.CapsEdit{Limits: map[string]int64{"db": 2}}, ""); err != nil {
		return nil, err
	}
	if d.payments, err = e.CreateNode(engine.System, engine.RootID, engine.NodeSpec{Name: "payments", Weight: 4,
		DefaultQuotas: map[string]int64{"retry": 3}}, ""); err != nil {
		return nil, err
	}
	if d.recon, err = e.CreateNode(engine.System, engine.RootID, engine.NodeSpec{Name: "reconciliation", Weight: 1}, ""); err != nil {
		return nil, err
	}
	if d.paySess, err = e.OpenSession(d.payments.ID, "demo-payments", time.Minute); err != nil {
		return nil, err
	}
	if d.reconSess, err = e.OpenSession(d.recon.ID, "demo-recon", time.Minute); err != nil {
		return nil, err
	}
	return d, nil
}

// retryBudget shows one budget of retries drawn from at every layer.
func (d *demo) retryBudget() error {
	fmt.Println("== a retry budget: every retry of checkout-42, at any layer, draws from one budget of 3")
	var err error
	if d.checkout, err = d.e.CreateNode(d.paySess, d.payments.ID, engine.NodeSpec{Name: "checkout-42"}, ""); err != nil {
		return err
	}
	for attempt := 1; attempt <= 5; attempt++ {
		err := d.e.Consume(d.paySess, d.checkout.ID, "retry", 1, "")
		var den *engine.Denial
		switch {
		case errors.As(err, &den):
			fmt.Printf("  retry %d: denied, %s is %d of %d on %q\n", attempt, den.Resource, den.Used, den.Limit, den.NodeName)
		case err != nil:
			return err
		default:
			fmt.Printf("  retry %d: allowed\n", attempt)
		}
	}
	return nil
}

// pool is the shared pool's holders and waiters.
type pool struct {
	e      *engine.Engine
	queue  []waiting
	held   []engine.Grant
	holder map[engine.LeaseID]engine.SessionID
}

type waiting struct {
	sess   engine.SessionID
	tenant string
	wait   *engine.Wait
}

// enqueue asks for n slots of the pool for a tenant's node.
func (p *pool) enqueue(sess engine.SessionID, node engine.NodeID, tenant string, n int) error {
	for range n {
		g, w, err := p.e.Acquire(sess, engine.AcquireRequest{Node: node, Class: "db"})
		if err != nil {
			return err
		}
		if w == nil {
			p.held, p.holder[g.Lease] = append(p.held, g), sess
			continue
		}
		p.queue = append(p.queue, waiting{sess, tenant, w})
	}
	return nil
}

// next releases the oldest slot held and says which tenant it went to.
func (p *pool) next() (string, error) {
	g := p.held[0]
	p.held = p.held[1:]
	if err := p.e.Release(p.holder[g.Lease], g.Lease, 10*time.Millisecond, false, ""); err != nil {
		return "", err
	}
	for i, q := range p.queue {
		select {
		case o := <-q.wait.C:
			if o.Err != nil {
				return "", o.Err
			}
			p.held, p.holder[o.Grant.Lease] = append(p.held, o.Grant), q.sess
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			return q.tenant, nil
		default:
		}
	}
	return "", nil
}

// sharedPool shows a pool of 2 shared by weight, 4:1.
func (d *demo) sharedPool() error {
	fmt.Println("== a shared pool of 2: reconciliation queues 100 jobs, payments 20, weights 4:1")
	batch, err := d.e.CreateNode(d.reconSess, d.recon.ID, engine.NodeSpec{Name: "nightly"}, "")
	if err != nil {
		return err
	}
	p := &pool{e: d.e, holder: map[engine.LeaseID]engine.SessionID{}}
	if err := p.enqueue(d.reconSess, batch.ID, "reconciliation", 100); err != nil {
		return err
	}
	if err := p.enqueue(d.paySess, d.checkout.ID, "payments", 20); err != nil {
		return err
	}
	grants := map[string]int{}
	var order []byte
	for len(p.held) > 0 && len(order) < 25 {
		tenant, err := p.next()
		if err != nil {
			return err
		}
		if tenant != "" {
			grants[tenant]++
			order = append(order, tenant[0])
		}
	}
	fmt.Printf("  the next 25 grants, in order (p = payments, r = reconciliation): %s\n", order)
	fmt.Printf("  payments %d, reconciliation %d: payments is served 4:1 although it queued 5x fewer\n",
		grants["payments"], grants["reconciliation"])
	return nil
}
