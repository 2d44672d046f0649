package budget

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/sidecar/admission"
)

// admitDirect admits work with delegation off: one ChargeAndAcquire, and a
// Release when the work ends.
func (n *node) admitDirect(ctx context.Context, r admission.Request) (admission.Ticket, error) {
	if r.Spent {
		for _, res := range slices.Sorted(maps.Keys(r.Charges)) {
			n.consumeUpTo(ctx, res, r.Charges[res])
		}
		return nil, nil
	}
	l, err := n.t.ChargeAndAcquire(ctx, r.Class, r.Charges)
	if err != nil {
		return nil, err
	}
	var t admission.Ticket
	if l != nil {
		n.s.a.m.slotGrants.WithLabelValues("single").Inc()
		t = &leaseTicket{s: n.s, n: n, l: l}
	}
	if r.Held {
		// Charged whole at governord: what the work leaves unused cannot
		// be given back (quota is never refunded), only what it uses
		// beyond is charged.
		return n.held(t, r.Charges, true), nil
	}
	return t, nil
}

// consumeUpTo charges up to amount of resource for work that already ran:
// when all of it would go over a cap, what is left under the cap (a few
// times, for caps higher up), so that the budget is recorded as spent.
func (n *node) consumeUpTo(ctx context.Context, resource string, amount int64) {
	for try := 0; try < 4 && amount > 0; try++ {
		err := n.t.Consume(ctx, resource, amount)
		var d *governor.Denial
		if !errors.As(err, &d) {
			return
		}
		left := d.Limit - d.Used
		if left <= 0 || left >= amount {
			return
		}
		amount = left
	}
}
