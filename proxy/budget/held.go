package budget

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// heldTicket is work admitted with held charges (admission.Request.Held):
// an estimate taken from the node's reservations (or held exactly at
// governord: admitHeld) and kept held, not spent, while the work runs, so
// that the part it leaves unused goes back instead of being reported as
// spent. It is an admission.Settler.
type heldTicket struct {
	n     *node
	slot  admission.Ticket // the class's slot; nil when none is held
	held  map[string]int64
	exact bool // held at governord (admitHeld), not in the node's reservations
	// trace is the span of the request an exact hold was taken for: its
	// settlement at governord is part of that request's trace.
	trace trace.SpanContext

	settle sync.Once
	end    sync.Once
}

// held wraps the ticket of work whose charges were taken (exact: held at
// governord instead) and are now held until it settles.
func (n *node) held(slot admission.Ticket, charges map[string]int64, exact bool) *heldTicket {
	return &heldTicket{n: n, slot: slot, held: charges, exact: exact}
}

func (t *heldTicket) Settle(used map[string]int64) {
	t.settle.Do(func() {
		for res, h := range t.held {
			u := min(max(used[res], 0), governor.MaxAmount) // a response's word is not trusted to be sane
			switch {
			case t.exact && h > 0:
				t.n.settleHold(t.trace, res, min(u, h), h-min(u, h))
			case !t.exact:
				q := t.n.reservation(res)
				q.spend(min(u, h))
				if u < h {
					q.untake(h - u)
				}
			}
			if u > h {
				t.spendBeyond(res, u-h)
			}
		}
	})
}

// spendBeyond charges what the work used beyond its estimate, in the
// background: the work has run, so it is charged as far as the caps allow.
func (t *heldTicket) spendBeyond(res string, extra int64) {
	n := t.n
	n.s.a.m.heldOver.Inc()
	n.s.a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(n.s.life, t.trace), callTimeout)
		defer cancel()
		if t.exact {
			n.consumeUpTo(ctx, res, extra)
			return
		}
		n.reservation(res).spendUpTo(ctx, extra)
	})
}

func (t *heldTicket) End(latency time.Duration, overloaded bool) {
	t.end.Do(func() {
		t.Settle(t.held)
		if t.slot != nil {
			t.slot.End(latency, overloaded)
		} else {
			t.n.unuse()
		}
	})
}
