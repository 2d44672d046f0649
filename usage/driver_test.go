package usage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

// driver makes random calls on an engine: what governord's clients do, in
// small numbers, so that leases, blocks and reservations start and end
// every way they can.
type driver struct {
	t     *testing.T
	rng   *rand.Rand
	e     *engine.Engine
	clock *fakeClock

	tenants  []engine.NodeID
	nodes    []engine.NodeID // every node made, open or not
	sessions []engine.SessionID
	scopes   map[engine.SessionID]engine.NodeID
	leases   []leaseOf
	// rateWaits are acquires waiting for tenant0's rate of calls, some
	// granted already, whose callers have not taken the outcome yet.
	rateWaits []rateWait
	tokens    int
	// stretch multiplies the time that passes between calls (1 when 0):
	// a history of days rather than of an hour.
	stretch int64
}

type rateWait struct {
	s engine.SessionID
	w *engine.Wait
}

type leaseOf struct {
	s engine.SessionID
	l engine.LeaseID
}

var (
	resources = []string{"tokens", "calls"}
	classes   = []string{"db", "llm"}
)

func newDriver(t *testing.T, rng *rand.Rand, e *engine.Engine, clock *fakeClock) *driver {
	d := &driver{t: t, rng: rng, e: e, clock: clock, scopes: map[engine.SessionID]engine.NodeID{}}
	for i := range 2 {
		spec := engine.NodeSpec{Name: fmt.Sprintf("tenant%d", i),
			Quotas: map[string]int64{"tokens": 5000}, Limits: map[string]int64{"db": 6, "llm": 4}}
		if i == 0 { // rate waits, and their grants given up at the instant
			spec.Rates = map[string]engine.Rate{"calls": {Units: 20, Per: int64(time.Minute)}}
		}
		v, err := e.CreateNode(engine.System, engine.RootID, spec, "")
		if err != nil {
			t.Fatal(err)
		}
		d.tenants = append(d.tenants, v.ID)
		d.nodes = append(d.nodes, v.ID)
	}
	return d
}

func (d *driver) pick(ids []engine.NodeID) engine.NodeID { return ids[d.rng.IntN(len(ids))] }

// ok fails the test on an error no random call may cause.
func (d *driver) ok(err error) {
	d.t.Helper()
	var denial *engine.Denial
	if err == nil || errors.As(err, &denial) {
		return
	}
	for _, expected := range []error{engine.ErrNotFound, engine.ErrTaskEnded, engine.ErrSessionExpired, engine.ErrUnauthenticated,
		engine.ErrLeaseExpired, engine.ErrLeaseRevoked, engine.ErrPermission, engine.ErrRecalling, engine.ErrBound, engine.ErrInvalid,
		engine.ErrRateLimited} {
		if errors.Is(err, expected) {
			return
		}
	}
	d.t.Fatalf("unexpected error: %v", err)
}

func (d *driver) session() (engine.SessionID, bool) {
	// The newest few: older ones have mostly expired or closed.
	live := d.sessions[max(0, len(d.sessions)-4):]
	if len(live) == 0 {
		return 0, false
	}
	return live[d.rng.IntN(len(live))], true
}

func (d *driver) step() {
	e, rng := d.e, d.rng
	switch op := rng.IntN(100); {
	case op < 8: // a session
		d.tokens++
		scope := d.pick(d.tenants)
		if rng.IntN(6) == 0 {
			scope = engine.RootID
		}
		sid, err := e.OpenSession(scope, fmt.Sprintf("tok%d", d.tokens), time.Duration(30+rng.IntN(120))*time.Second)
		d.ok(err)
		if err == nil {
			d.sessions = append(d.sessions, sid)
			d.scopes[sid] = scope
		}
	case op < 18: // a task or subtask
		parent := d.pick(d.nodes)
		v, err := e.CreateNode(engine.System, parent, engine.NodeSpec{Name: fmt.Sprintf("n%d", len(d.nodes)),
			Quotas: map[string]int64{"tokens": int64(200 + rng.IntN(800))}, Limits: map[string]int64{"db": int64(1 + rng.IntN(3))}}, "")
		d.ok(err)
		if err == nil {
			d.nodes = append(d.nodes, v.ID)
		}
	case op < 30:
		if s, ok := d.session(); ok {
			d.ok(e.Consume(s, d.pick(d.nodes), resources[rng.IntN(2)], int64(1+rng.IntN(50)), ""))
		}
	case op < 45:
		if s, ok := d.session(); ok {
			req := engine.AcquireRequest{Node: d.pick(d.nodes), Class: classes[rng.IntN(2)]}
			if rng.IntN(2) == 0 {
				req.Charges = map[string]int64{resources[rng.IntN(2)]: int64(1 + rng.IntN(20))}
			}
			if rng.IntN(2) == 0 {
				req.WaitRate = true
				req.Node, req.Charges = d.tenants[0], map[string]int64{"calls": int64(4 + rng.IntN(17))}
				if rng.IntN(2) == 0 {
					req.Class = ""
				}
			}
			g, w, err := e.Acquire(s, req)
			d.ok(err)
			switch {
			case w != nil && req.WaitRate:
				d.rateWaits = append(d.rateWaits, rateWait{s, w})
			case w != nil:
				e.CancelWait(w)
			case err == nil && g.Lease != 0:
				d.leases = append(d.leases, leaseOf{s, g.Lease})
				if rng.IntN(8) == 0 { // its caller gave up at the instant of the grant
					_, err := e.GiveBack(s, req, g.Lease)
					d.ok(err)
				}
			}
		}
	case op < 57:
		if len(d.leases) > 0 {
			i := rng.IntN(len(d.leases))
			l := d.leases[i]
			d.leases = append(d.leases[:i], d.leases[i+1:]...)
			d.ok(e.Release(l.s, l.l, time.Millisecond, false, ""))
		}
	case op < 64:
		if s, ok := d.session(); ok {
			r := engine.BlockRequest{Node: d.pick(d.nodes), Class: classes[rng.IntN(2)]}
			if rng.IntN(3) == 0 {
				r.Return = int64(1 + rng.IntN(2))
			} else {
				r.Want = int64(1 + rng.IntN(3))
			}
			_, err := e.Block(s, r)
			d.ok(err)
		}
	case op < 72:
		if s, ok := d.session(); ok {
			r := engine.ReserveRequest{Node: d.pick(d.nodes), Resource: "tokens"}
			switch rng.IntN(3) {
			case 0:
				r.Want = int64(1 + rng.IntN(40))
			case 1:
				r.Spent = int64(rng.IntN(5))
			case 2:
				r.Return = int64(rng.IntN(5))
			}
			_, err := e.Reserve(s, r)
			d.ok(err)
		}
	case op < 77:
		if len(d.nodes) > 2 {
			id := d.nodes[2+rng.IntN(len(d.nodes)-2)]
			states := []engine.State{engine.Closed, engine.Cancelled}
			_, err := e.EndNode(engine.System, id, states[rng.IntN(2)], "")
			d.ok(err)
		}
	case op < 81:
		if s, ok := d.session(); ok {
			d.ok(e.CloseSession(s))
			for i, x := range d.sessions {
				if x == s {
					d.sessions = append(d.sessions[:i], d.sessions[i+1:]...)
					break
				}
			}
		}
	case op < 84:
		if len(d.nodes) > 2 {
			_, err := e.SetCaps(engine.System, d.nodes[2+rng.IntN(len(d.nodes)-2)],
				engine.CapsEdit{Limits: map[string]int64{"db": int64(rng.IntN(4))}}, "")
			d.ok(err)
		}
	case op < 88:
		d.endRateWait()
	default: // time passes: within a minute mostly, sometimes across several
		step := time.Duration(rng.Int64N(int64(20 * time.Second)))
		if rng.IntN(10) == 0 {
			step = time.Duration(rng.Int64N(int64(4 * time.Minute)))
		}
		d.clock.ns.Add(int64(step) * max(d.stretch, 1))
		if rng.IntN(2) == 0 { // most sessions stay alive across it, with their leases
			for _, s := range d.sessions[max(0, len(d.sessions)-4):] {
				_, err := e.Heartbeat(s)
				d.ok(err)
			}
		}
		e.Reap()
	}
}

// endRateWait ends a rate wait: its caller takes the grant when it has
// come, or gives up, perhaps at the instant of the grant (undone whole).
func (d *driver) endRateWait() {
	if len(d.rateWaits) == 0 {
		return
	}
	i := d.rng.IntN(len(d.rateWaits))
	rw := d.rateWaits[i]
	d.rateWaits = append(d.rateWaits[:i], d.rateWaits[i+1:]...)
	if len(rw.w.C) > 0 && d.rng.IntN(2) == 0 {
		o := <-rw.w.C
		d.ok(o.Err)
		if o.Err == nil && o.Grant.Lease != 0 {
			d.leases = append(d.leases, leaseOf{rw.s, o.Grant.Lease})
		}
		return
	}
	d.e.CancelWait(rw.w)
}
