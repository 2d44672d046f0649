package engine

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Every error the engine returns wraps exactly one of these
// (a quota denial is a *Denial, which matches ErrQuotaExhausted), so callers
// map errors to status codes with errors.Is.
var (
	// ErrInvalid: the request is malformed (empty name, negative amount, ...).
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: no such node, lease or session scope, as far as the
	// session can see: a node or lease outside its scope is not found
	// either, with the same message, so that a tenant cannot tell another
	// tenant's ids from ids that never existed.
	ErrNotFound = errors.New("not found")
	// ErrPermission: the target lies inside the session's scope, but the
	// session may not do this to it: edit, close or cancel its own scope
	// node, or release another session's lease.
	ErrPermission = errors.New("permission denied")
	// ErrUnauthenticated: no such session (never opened, closed or expired
	// and already reaped).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrSessionExpired: the session's TTL passed without a heartbeat.
	ErrSessionExpired = errors.New("session expired")
	// ErrTaskEnded: the node, or an ancestor, is closed, cancelled or past
	// its deadline.
	ErrTaskEnded = errors.New("task ended")
	// ErrQuotaExhausted: a quota on the chain would be exceeded. The error is
	// a *Denial carrying the details.
	ErrQuotaExhausted = errors.New("quota exhausted")
	// ErrLeaseExpired: the lease ended because its session expired.
	ErrLeaseExpired = errors.New("lease expired")
	// ErrLeaseRevoked: the lease ended because its node ended. (A lease whose
	// session was closed counts as released by its holder.)
	ErrLeaseRevoked = errors.New("lease revoked")
	// ErrLeaseReleased: Validate of a lease that was released.
	ErrLeaseReleased = errors.New("lease released")
	// ErrRequestIDReused: a request id was sent again with different arguments.
	ErrRequestIDReused = errors.New("request id reused with different arguments")
	// ErrExists: an open sibling already has that name.
	ErrExists = errors.New("already exists")
	// ErrRecalling: a charge or reservation does not fit only because other
	// sessions hold unspent reserved units on the chain. Those are being
	// recalled; the same request is likely to fit, or be denied for good,
	// when tried again shortly. Nothing was charged.
	ErrRecalling = errors.New("quota held by reservations being recalled")
	// ErrCorrupt: Restore or Apply was given a snapshot or event that does not
	// follow from the state it is applied to.
	ErrCorrupt = errors.New("corrupt record")
	// ErrBound: the tenant holds as much as its bounds allow (open sessions,
	// open nodes, queued acquires, distinct names). The error is a
	// *BoundError naming the bound (bounds.go).
	ErrBound = errors.New("tenant bound reached")
	// ErrTenantState: the tenant's state (suspended, read_only, closing)
	// refuses this work. The error is a *TenantStateError (tenantstate.go).
	ErrTenantState = errors.New("refused by the tenant's state")
	// ErrRateLimited: a rate on the chain holds fewer units than the
	// charge asks; it will hold them later. The error is a *RateError
	// carrying when to try again (rate.go).
	ErrRateLimited = errors.New("rate limited")
)

// Consumer names the part of a node that spent most of a resource: one of its
// children, or the node itself for what was charged to it directly. Node is
// 0 for ReclaimedConsumer and OtherTenant.
type Consumer struct {
	Node NodeID
	Name string
	Used int64
}

// Denial explains a refused charge: which cap was hit, where, how full it was,
// and who spent it.
type Denial struct {
	Resource string
	Node     NodeID
	NodeName string
	Used     int64 // usage of Resource on Node before this charge
	Limit    int64 // the cap on Node
	Amount   int64 // what the refused charge asked for
	Largest  Consumer
	// ResetAt is when the quota's period starts a new window (unix ns;
	// period.go), 0 for a quota that never resets. Used is then the
	// window's spend.
	ResetAt int64
}

// OtherTenant is the largest consumer, with node 0 and no usage, of a denial
// on a node shared with other tenants (the root) as a tenant's session sees
// it when that consumer is not inside the session's scope: who else spent a
// shared cap, and how much, is theirs to know.
const OtherTenant = "another tenant"

func (d *Denial) Error() string {
	s := fmt.Sprintf("quota exhausted: %s on %q (node %d) is %d of %d, asked %d more",
		d.Resource, d.NodeName, d.Node, d.Used, d.Limit, d.Amount)
	if d.ResetAt != 0 {
		s += "; resets at " + time.Unix(0, d.ResetAt).UTC().Format(time.RFC3339Nano)
	}
	if d.Largest.Node == 0 && d.Largest.Name == OtherTenant {
		return s + "; largest consumer: " + OtherTenant
	}
	if d.Largest.Name == "" { // a cap of 0, say: nothing used it
		return s
	}
	return s + fmt.Sprintf("; largest consumer %q used %d", d.Largest.Name, d.Largest.Used)
}

// Is makes errors.Is(d, ErrQuotaExhausted) true.
func (d *Denial) Is(target error) bool { return target == ErrQuotaExhausted }

// EndedError says which node's end refused a call. It matches ErrTaskEnded.
type EndedError struct {
	Node  NodeID
	Name  string
	Kind  Kind
	State State
	// Deadline is true when the node expired: its deadline passed.
	Deadline bool
}

func (e *EndedError) Error() string {
	if e.Deadline {
		return fmt.Sprintf("task ended: %s %q passed its deadline", e.Kind, e.Name)
	}
	return fmt.Sprintf("task ended: %s %q is %s", e.Kind, e.Name, e.State)
}

// Is makes errors.Is(e, ErrTaskEnded) true.
func (e *EndedError) Is(target error) bool { return target == ErrTaskEnded }

// LeaseEndedError says how a lease that is no longer held ended. It matches
// ErrLeaseReleased, ErrLeaseExpired or ErrLeaseRevoked, by Reason.
type LeaseEndedError struct {
	Lease  LeaseID
	Reason EndReason
}

func (e *LeaseEndedError) Error() string {
	switch e.Reason {
	case EndExpired:
		return fmt.Sprintf("lease expired: lease %d ended when its session expired", e.Lease)
	case EndRevoked:
		return fmt.Sprintf("lease revoked: lease %d ended when its node ended", e.Lease)
	}
	return fmt.Sprintf("lease released: lease %d", e.Lease)
}

// Is matches the sentinel of the lease's end.
func (e *LeaseEndedError) Is(target error) bool {
	switch e.Reason {
	case EndExpired:
		return target == ErrLeaseExpired
	case EndRevoked:
		return target == ErrLeaseRevoked
	}
	return target == ErrLeaseReleased
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
