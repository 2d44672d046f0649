package budget

import (
	"context"
	"errors"
	"maps"
	"slices"

	"go.opentelemetry.io/otel/trace"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// admitDirect admits work with delegation off: one ChargeAndAcquire, and a
// Release when the work ends (or, for held charges, admitHeld). With
// waitRate the ChargeAndAcquire waits at governord for a rate that refuses
// it, within ctx (pace.go).
func (n *node) admitDirect(ctx context.Context, r admission.Request, waitRate bool) (admission.Ticket, error) {
	if r.Spent {
		for _, res := range slices.Sorted(maps.Keys(r.Charges)) {
			n.consumeUpTo(ctx, res, r.Charges[res])
		}
		return nil, nil
	}
	if r.Held {
		return n.admitHeld(ctx, r)
	}
	acquire := n.t.ChargeAndAcquire
	if r.Write { // a read-only tenant refuses it (tenant states)
		acquire = n.t.ChargeAndAcquireWrite
	}
	var opts []governor.ChargeOption
	if waitRate {
		opts = append(opts, governor.WaitForRate())
	}
	l, err := acquire(ctx, r.Class, r.Charges, opts...)
	if err != nil {
		return nil, counted(err)
	}
	if l == nil {
		return nil, nil
	}
	return n.leaseTicket(l), nil
}

func (n *node) leaseTicket(l *governor.Lease) *leaseTicket {
	n.s.a.m.slotGrants.WithLabelValues("single").Inc()
	return &leaseTicket{s: n.s, n: n, l: l}
}

// admitHeld admits work with held charges (a metered call's estimate) at
// governord, for work that cannot take them from the session's
// reservations (delegation off, or a top-up short near the quota's edge):
// each charge is reserved exactly, all of it or nothing as a consume would
// be checked, and then the slot is acquired. The ticket settles each hold
// to what the work used, so that what it did not use goes back.
func (n *node) admitHeld(ctx context.Context, r admission.Request) (admission.Ticket, error) {
	resources := slices.Sorted(maps.Keys(r.Charges))
	for i, res := range resources {
		if r.Charges[res] <= 0 {
			continue
		}
		h, err := n.t.ReserveExactly(ctx, res, r.Charges[res])
		if err != nil {
			n.giveBackHolds(ctx, resources[:i], r.Charges)
			if ctx.Err() != nil { // governord held it back while other work's holds were out
				err = &admission.QuotaWait{Resource: res, Amount: r.Charges[res], Err: err}
			}
			return nil, err
		}
		if r.Write && h.ReadOnly != nil { // the tenant is read_only: a hold is no write
			n.giveBackHolds(ctx, resources[:i+1], r.Charges)
			return nil, h.ReadOnly
		}
	}
	acquire := n.t.ChargeAndAcquire
	if r.Write {
		acquire = n.t.ChargeAndAcquireWrite
	}
	var t admission.Ticket
	if r.Class != "" {
		l, err := acquire(ctx, r.Class, nil)
		if err != nil {
			n.giveBackHolds(ctx, resources, r.Charges)
			return nil, counted(err)
		}
		t = n.leaseTicket(l)
	}
	h := n.held(t, r.Charges, true)
	h.trace = trace.SpanContextFromContext(ctx)
	return h, nil
}

// giveBackHolds gives back exact holds of work that was not admitted, in
// the background: a hold that cannot be given back counts as spent when
// the session ends, so the caps still hold.
func (n *node) giveBackHolds(ctx context.Context, resources []string, charges map[string]int64) {
	for _, res := range resources {
		if h := charges[res]; h > 0 {
			n.settleHold(trace.SpanContextFromContext(ctx), res, 0, h)
		}
	}
}

// settleHold settles an exact hold of resource in the background, in the
// trace of the request that held it: spent units are charged for good, ret
// units go back.
func (n *node) settleHold(request trace.SpanContext, res string, spent, ret int64) {
	n.s.a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(n.s.life, request), callTimeout)
		defer cancel()
		if _, err := n.t.Reserve(ctx, res, spent, ret, 0); err != nil {
			n.s.a.log.Warn("governor-proxy: settling a held estimate failed; governord counts it as spent when the session ends",
				"resource", res, "spent", spent, "return", ret, "err", err)
		}
	})
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
