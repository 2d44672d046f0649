package budget

import (
	"sync"
	"sync/atomic"

	"github.com/governor-project/governor/governor"
)

// A read_only tenant refuses work classified as a write
// (admission.Request.Write). A call to governord says so itself; what is
// granted from delegated budgets is decided here, from what governord said
// when it delegated them: each answer to a top-up (a block's growth, a
// reservation) carries the refusal a write gets while the tenant is
// read_only, and a node remembers the latest. A write is refused once it
// has taken what it needs (so that a top-up it caused has answered), with
// the refusal governord gave: the same 403 read-only, the same SQLSTATE.
//
// When the tenant's state changes to or from read_only (or is suspended),
// governord recalls everything delegated under it. From the recall on, a
// node grants nothing from budgets it held before: its blocks stop
// granting until they grow again and its reservations give their units
// back, so every request needs a top-up, whose answer says the new state.
// A top-up already in flight when the recall arrived may have been
// answered before the change; its answer is stale: what it brought goes
// back at once and its word on the state is not taken. So once a recall
// has arrived, no write is granted from a budget obtained before governord
// knew of the change. (A recall sent while the Watch stream was down is
// lost; then the change is learnt with the next top-up, as a suspension
// is.)

// tenantView is what the answers to a node's top-ups said of its tenant's
// state.
type tenantView struct {
	mu sync.Mutex
	// epoch moves at each recall of everything delegated on the node:
	// answers to top-ups begun before it are stale.
	epoch uint64
	// readOnly is the refusal of a write, as the latest answer that was
	// not stale said; nil: writes go on. Set under mu, read without it
	// (each write reads it).
	readOnly atomic.Pointer[governor.TenantStateError]
}

// begin returns the epoch a top-up starts in; call it before the call is
// sent.
func (v *tenantView) begin() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.epoch
}

// learn takes what the answer to a top-up begun in epoch said of the
// tenant's state, and reports whether the answer is current; a stale one
// (a recall came since it began) teaches nothing, and what it granted must
// go back.
func (v *tenantView) learn(epoch uint64, readOnly *governor.TenantStateError) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if epoch != v.epoch {
		return false
	}
	v.readOnly.Store(readOnly)
	return true
}

// recalled notes a recall of everything delegated on the node.
func (v *tenantView) recalled() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.epoch++
}

// refusesWrites returns the refusal a write gets from what the node holds,
// or nil.
func (v *tenantView) refusesWrites() error {
	ro := v.readOnly.Load()
	if ro == nil {
		return nil
	}
	e := *ro // the caller's own copy
	return &e
}
