package engine

import (
	"fmt"
	"time"
)

// EventKind says what an event changed.
type EventKind uint8

// The kinds of event. Their numbers are part of the record format: append
// new kinds at the end, never renumber.
const (
	EvSessionOpened EventKind = iota + 1
	EvSessionEnded
	EvNodeCreated
	EvNodeEnded
	EvCapsSet
	EvConsumed
	EvCharged
	EvLeaseGranted
	EvLeaseReleased
	EvLimitAdjusted
	EvBlockResized
	EvReserved
	EvNodesReclaimed
	EvCapsReverted
	EvTenantStateSet
	EvShadowCharged
	EvPeriodReset
	EvSliceEnded
)

var kindNames = [...]string{
	EvSessionOpened: "session_opened",
	EvSessionEnded:  "session_ended",
	EvNodeCreated:   "node_created",
	EvNodeEnded:     "node_ended",
	EvCapsSet:       "caps_set",
	EvConsumed:      "consumed",
	EvCharged:       "charged",
	EvLeaseGranted:  "lease_granted",
	EvLeaseReleased: "lease_released",
	EvLimitAdjusted: "limit_adjusted",
	EvBlockResized:  "block_resized",
	EvReserved:      "reserved",

	EvNodesReclaimed: "nodes_reclaimed",
	EvCapsReverted:   "caps_reverted",
	EvTenantStateSet: "tenant_state_set",
	EvShadowCharged:  "shadow_charged",
	EvPeriodReset:    "period_reset",
	EvSliceEnded:     "slice_ended",
}

func (k EventKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Charge is an amount of one resource.
type Charge struct {
	Resource string `json:"r"`
	Amount   int64  `json:"a"`
}

// Event is one change to the state. Which fields are set depends on Kind;
// fields that do not apply are zero. The whole state is a function of the
// sequence of events, so an event carries every input its apply needs,
// including the time it was decided at.
type Event struct {
	Seq  uint64    `json:"seq"`
	Kind EventKind `json:"k"`
	At   int64     `json:"at"` // unix nanoseconds when it was decided

	Session SessionID `json:"s,omitempty"`
	Node    NodeID    `json:"n,omitempty"` // target node; the new node for EvNodeCreated
	Parent  NodeID    `json:"p,omitempty"` // EvNodeCreated
	Lease   LeaseID   `json:"l,omitempty"`

	// Resource is the consumed resource, or the lease class of a grant or an
	// adjusted limit.
	Resource string `json:"r,omitempty"`
	// Amount is the consumed amount, a session's TTL in nanoseconds, an
	// adjusted limit's new value, a new block's slots (EvLeaseGranted with
	// Block), the slots a block grows (or, negative, shrinks) by, or the
	// units a reservation adds (EvReserved).
	Amount int64 `json:"a,omitempty"`
	// Block marks the EvLeaseGranted of a block (block.go).
	Block bool `json:"blk,omitempty"`
	// Spent and Returned settle a reservation (EvReserved): units spent,
	// now charged, and unspent units given back.
	Spent    int64 `json:"sp,omitempty"`
	Returned int64 `json:"rt,omitempty"`
	// Token is the SHA-256 hash of a session's token (EvSessionOpened).
	Token string `json:"tok,omitempty"`

	// Charges made (EvCharged, EvLeaseGranted), undone with a grant its
	// caller never saw (EvLeaseReleased with Forget), or counted in the
	// shadow ledger only (EvShadowCharged; dryrun.go).
	Charges []Charge  `json:"ch,omitempty"`
	Spec    *NodeSpec `json:"spec,omitempty"` // EvNodeCreated
	Caps    *CapsEdit `json:"caps,omitempty"` // EvCapsSet, EvCapsReverted
	State   State     `json:"st,omitempty"`   // EvNodeEnded
	Reason  EndReason `json:"why,omitempty"`  // EvSessionEnded

	// Audit is who made a cap edit, why, what it replaced and, for a
	// temporary override, when it reverts (EvCapsSet, EvCapsReverted;
	// override.go).
	Audit *CapsAudit `json:"audit,omitempty"`

	// Nodes are the ended nodes reclaimed, each with its whole subtree, in
	// this order (EvNodesReclaimed).
	Nodes []NodeID `json:"ns,omitempty"`

	// RequestID and Fingerprint are remembered by the session, so a retry
	// returns this event's result, even after a restart.
	RequestID   string `json:"rid,omitempty"`
	Fingerprint uint64 `json:"fp,omitempty"`
	// Forget is a request id the session must forget (EvLeaseReleased of a
	// grant its caller gave up at the instant it arrived): the caller never
	// saw the lease, so a retry must be decided afresh.
	Forget string `json:"forget,omitempty"`
	// GivenBack marks the EvLeaseReleased of a grant whose caller gave up at
	// the instant it arrived: the grant is undone whole, its Charges too.
	// On an EvCharged it undoes a charge granted without a lease (a rate
	// waiter's, ratewait.go) that its caller gave up at that instant, made
	// at ChargedAt: what it spent in a window that has reset since stays
	// spent there.
	GivenBack bool  `json:"gb,omitempty"`
	ChargedAt int64 `json:"cat,omitempty"`

	// Warnings are the soft and warn_only caps this charge or grant went
	// past without being refused (policy.go): what the log keeps of every
	// would-be denial. Apply ignores them.
	Warnings []Warning `json:"warn,omitempty"`

	// TenantState is a tenant's new state, and Revoke says its leases end
	// with the change (EvTenantStateSet; tenantstate.go). Write marks a
	// grant or charge of work classified as a write (EvLeaseGranted,
	// EvCharged), which a read_only tenant refuses.
	TenantState TenantState `json:"ts,omitempty"`
	Revoke      bool        `json:"rv,omitempty"`
	Write       bool        `json:"wr,omitempty"`

	// Windows are the windows that periods open, by resource, decided
	// when the event was (EvNodeCreated, EvCapsSet for the periods set or
	// changed, EvPeriodReset for Resource's next window; period.go).
	// EvPeriodReset's Amount is what the window ending spent.
	Windows map[string]Window `json:"win,omitempty"`

	// Slice is the slice of a rate an EvReserved grants or renews
	// (slice.go); EvSliceEnded ends the session's slice of Resource on
	// Node.
	Slice *SliceGrant `json:"sl,omitempty"`
}

// apply changes the state as ev says. It is the only code that changes
// persistent state, on the live path and in replay alike. It reads no clock
// except to give a replayed session its fresh TTL.
func (e *Engine) apply(ev *Event) error {
	if err := e.applyKind(ev); err != nil {
		return err
	}
	e.remember(ev)
	return nil
}

func (e *Engine) applyKind(ev *Event) error {
	switch ev.Kind {
	case EvSessionOpened:
		return e.applySessionOpened(ev)
	case EvSessionEnded:
		s := e.sessions[ev.Session]
		if s == nil {
			return fmt.Errorf("%w: no session %d", ErrCorrupt, ev.Session)
		}
		e.applySessionEnded(s, ev)
	case EvNodeCreated:
		return e.applyNodeCreated(ev)
	case EvNodeEnded:
		n := e.nodes[ev.Node]
		if n == nil || !ev.State.Ended() {
			return fmt.Errorf("%w: cannot end node %d as %v", ErrCorrupt, ev.Node, ev.State)
		}
		e.applyNodeEnded(n, ev)
	case EvCapsSet:
		return e.applyCapsSet(ev)
	case EvCapsReverted:
		return e.applyCapsReverted(ev)
	case EvConsumed, EvCharged:
		return e.applyCharged(ev)
	case EvLeaseGranted:
		return e.applyGrant(ev)
	case EvLeaseReleased:
		return e.applyReleased(ev)
	case EvLimitAdjusted:
		n := e.nodes[ev.Node]
		if n == nil || ev.Amount < 0 {
			return fmt.Errorf("%w: limit on node %d", ErrCorrupt, ev.Node)
		}
		n.limit.setCap(ev.Resource, ev.Amount)
	case EvBlockResized:
		return e.applyBlockResized(ev)
	case EvReserved:
		return e.applyReserved(ev)
	case EvNodesReclaimed:
		return e.applyReclaimed(ev)
	case EvTenantStateSet:
		return e.applyTenantState(ev)
	case EvPeriodReset:
		return e.applyPeriodReset(ev)
	case EvSliceEnded:
		return e.applySliceEnded(ev)
	case EvShadowCharged:
		n := e.nodes[ev.Node]
		if n == nil || len(ev.Charges) == 0 {
			return fmt.Errorf("%w: shadow charge on node %d", ErrCorrupt, ev.Node)
		}
		for _, c := range ev.Charges {
			n.shadowCharge(c.Resource, c.Amount)
		}
	default:
		return fmt.Errorf("%w: unknown event kind %v", ErrCorrupt, ev.Kind)
	}
	return nil
}

func (e *Engine) applyCapsSet(ev *Event) error {
	n := e.nodes[ev.Node]
	if n == nil || ev.Caps == nil {
		return fmt.Errorf("%w: caps for node %d", ErrCorrupt, ev.Node)
	}
	n.applyCaps(ev.Caps, e, ev.At, ev.Windows)
	e.record(n, ev)
	return nil
}

// applyCharged applies a consume (one resource) or a charge (several).
func (e *Engine) applyCharged(ev *Event) error {
	n := e.nodes[ev.Node]
	if ev.Kind == EvConsumed {
		if n == nil || ev.Amount <= 0 {
			return fmt.Errorf("%w: consume on node %d", ErrCorrupt, ev.Node)
		}
		n.charge(ev.Resource, ev.Amount)
		n.takeRate(ev.Resource, ev.Amount, ev.At)
		return nil
	}
	if n == nil {
		return fmt.Errorf("%w: charge on node %d", ErrCorrupt, ev.Node)
	}
	if ev.GivenBack {
		return e.applyChargeGivenBack(n, ev)
	}
	for _, c := range ev.Charges {
		n.charge(c.Resource, c.Amount)
	}
	n.takeRates(ev.Charges, ev.At, 1)
	return nil
}

// applyChargeGivenBack undoes ev's charges on n, made at ev.ChargedAt,
// and forgets the request that made them.
func (e *Engine) applyChargeGivenBack(n *node, ev *Event) error {
	if len(ev.Charges) == 0 || ev.ChargedAt > ev.At {
		return fmt.Errorf("%w: charges given back on node %d", ErrCorrupt, ev.Node)
	}
	for _, c := range ev.Charges {
		if c.Amount <= 0 {
			return fmt.Errorf("%w: %d %s given back on node %d", ErrCorrupt, c.Amount, c.Resource, ev.Node)
		}
	}
	for _, c := range ev.Charges {
		n.unchargePeriods(c.Resource, c.Amount, ev.ChargedAt)
		n.charge(c.Resource, -c.Amount)
	}
	n.takeRates(ev.Charges, ev.At, -1)
	if s := e.sessions[ev.Session]; s != nil && ev.Forget != "" {
		s.requests.forget(ev.Forget)
	}
	return nil
}

func (e *Engine) applyReleased(ev *Event) error {
	l := e.leases[ev.Lease]
	if l == nil {
		return fmt.Errorf("%w: release of lease %d not held", ErrCorrupt, ev.Lease)
	}
	e.endLease(l, EndReleased, ev.At)
	if ev.Forget != "" {
		l.session.requests.forget(ev.Forget)
	}
	if ev.GivenBack { // a grant given back undoes its charges
		for _, c := range ev.Charges {
			l.node.unchargePeriods(c.Resource, c.Amount, l.granted)
			l.node.charge(c.Resource, -c.Amount)
		}
		l.node.takeRates(ev.Charges, ev.At, -1)
	}
	return nil
}

// remember records a request id in its session's memory.
func (e *Engine) remember(ev *Event) {
	if ev.RequestID == "" {
		return
	}
	if s := e.sessions[ev.Session]; s != nil {
		r := requestResult{fingerprint: ev.Fingerprint, node: ev.Node, lease: ev.Lease}
		if ev.Kind == EvBlockResized || ev.Kind == EvReserved || ev.Block {
			r.amount = ev.Amount // what a block or reservation request granted
		}
		if ev.Kind == EvCharged {
			r.chargedAt = ev.At // a charge without a lease (GiveBackCharged)
		}
		s.requests.add(ev.RequestID, r)
	}
}

func (e *Engine) applySessionOpened(ev *Event) error {
	scope := e.nodes[ev.Node]
	if scope == nil || ev.Session < e.nextSession || ev.Amount <= 0 {
		return fmt.Errorf("%w: session %d on node %d", ErrCorrupt, ev.Session, ev.Node)
	}
	if _, taken := e.byToken[ev.Token]; taken && ev.Token != "" {
		return fmt.Errorf("%w: token of session %d already in use", ErrCorrupt, ev.Session)
	}
	ttl := time.Duration(ev.Amount)
	s := &session{
		id:      ev.Session,
		scope:   scope,
		token:   ev.Token,
		ttl:     ttl,
		expires: expiry(max(ev.At, e.now()), ttl),
		leases:  make(map[LeaseID]*lease),
	}
	e.sessions[s.id] = s
	e.soonest = min(e.soonest, s.expires)
	if s.token != "" {
		e.byToken[s.token] = s
	}
	scope.pinSession()
	e.nextSession = s.id + 1
	return nil
}
