// Package admission is the sidecar's one admission layer, as its HTTP side
// and its PostgreSQL side both see it: a Request for a unit of work (a class
// to hold a slot of while it runs, quota to charge first, the subtask it is
// for), an Admitter that grants it or refuses it, a Ticket that ends it,
// and a Denial whose Cause reads on the wire as the table of causes says
// (wire.go: its HTTP status, Governor-Denied word, retry headers and
// SQLSTATE; the metrics' cause labels come from it too).
//
// It may import the standard library, the Go SDK (for the details of a
// denial) and the generated API (for the causes' values) only. The
// Admitter governor-proxy runs is package budget's.
package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/governor-project/governor/governor"
)

// Request is one unit of work to admit.
type Request struct {
	// Subtask names the subtask of the worker's task the work is charged to
	// (a Proxy-Authorization username, an application_name); "" is the task
	// itself.
	Subtask string
	// Class is the lease class to hold a slot of while the work runs; ""
	// holds none.
	Class string
	// Charges are quota amounts by resource, charged before the work runs:
	// all of them or none.
	Charges map[string]int64
	// Spent marks work that has already run (a charge read from a response
	// header): charge what is left under the caps, up to Charges, instead
	// of refusing. Class is ignored.
	Spent bool
	// Held marks Charges as an estimate of work whose cost is known only
	// when it ends (the tokens of an LLM call): they are held, not spent,
	// while it runs, and its Ticket, never nil, is a Settler that says
	// what was used.
	Held bool
	// Write marks work classified as a write (an HTTP method other than
	// GET, HEAD, OPTIONS unless the rule says read; a SQL statement that
	// may write), which a read-only tenant refuses.
	Write bool
	// DenyRate refuses work a rate has no room for at once (a rule's
	// on_rate: deny). Otherwise the Admitter paces it: it waits until the
	// rate has room, as long as ctx allows, and refuses it for rate only
	// when that wait cannot fit.
	DenyRate bool
}

// Ticket is admitted work. End it once, when the work is done.
type Ticket interface {
	// End gives the slot back and reports the work's latency (0: no
	// sample) and whether the downstream signalled overload, for adaptive
	// limits.
	End(latency time.Duration, overloaded bool)
}

// Settler is the Ticket of work admitted with Held charges.
type Settler interface {
	Ticket
	// Settle spends what the work used of the held charges, by resource,
	// and gives back the rest; use beyond what was held is charged as a
	// Spent request is, as far as the caps allow. Call it at most once,
	// before End; a ticket ended without it spends all that was held.
	Settle(used map[string]int64)
}

// Admitter admits work. Admit blocks while the work waits for a slot, until
// ctx ends: a ctx from WithWaitTimeout ends as a wait-timeout denial, any
// other as canceled. It returns a nil Ticket for work that holds no slot,
// and a *Denial for work it refuses. Implementations are safe for
// concurrent use.
type Admitter interface {
	Admit(ctx context.Context, r Request) (Ticket, error)
}

// Fast is an Admitter that can often admit work at once: without waiting
// and without asking anyone, as from a budget held locally. A caller tries
// TryAdmit first, and calls Admit, with the context that bounds a wait,
// only when it says no.
type Fast interface {
	// TryAdmit admits r if that needs no wait and no call; ok is false
	// otherwise, and then nothing was taken.
	TryAdmit(r Request) (t Ticket, ok bool)
}

// Cause is why work was refused: the Go SDK's governor.Cause (the Cause
// of governor.proto), with the same values, rendered as the table of
// causes says (Wire). causeFrom is the one conversion.
type Cause governor.Cause

// The causes the sidecar answers with. Their names are the values of the
// Governor-Denied header and of the "cause" metrics label.
const (
	CauseQuota       = Cause(governor.CauseQuota)       // a quota on the node or an ancestor is spent
	CauseWaitTimeout = Cause(governor.CauseWaitTimeout) // no slot within the wait timeout
	CauseUnavailable = Cause(governor.CauseUnavailable) // governord unreachable, or no session: fail closed
	CauseTaskEnded   = Cause(governor.CauseTaskEnded)   // the task or subtask ended or passed its deadline
	CauseUnmatched   = Cause(governor.CauseUnmatched)   // no rule matched, and unmatched traffic is denied
	CauseBadRequest  = Cause(governor.CauseBadRequest)  // the request names a subtask badly, or too many
	CauseCanceled    = Cause(governor.CauseCanceled)    // the client went away while it waited
	CauseStopping    = Cause(governor.CauseStopping)    // the sidecar is shutting down and admits nothing new
	CauseSuspended   = Cause(governor.CauseSuspended)   // the tenant is suspended: no new work
	CauseReadOnly    = Cause(governor.CauseReadOnly)    // the tenant is read-only and this is a write
	CauseRate        = Cause(governor.CauseRate)        // a rate on the node or an ancestor has no room now
)

// String is the cause's name on the wire (governor.Cause's).
func (c Cause) String() string { return governor.Cause(c).String() }

// Denial is work that was refused.
type Denial struct {
	Cause Cause
	// Class is the lease class the work asked for, if any.
	Class string
	// Wait is the wait timeout that ran out (CauseWaitTimeout).
	Wait time.Duration
	// WaitedFor, for a wait timeout spent waiting for quota units rather
	// than for a slot, names them: what the work asked of which resource.
	WaitedFor *QuotaWait
	// Estimate, for a metered call refused for quota while the quota still
	// had room, says that the call's estimate is what did not fit, and
	// what would.
	Estimate *EstimateFit
	// Quota names the cap that was hit (CauseQuota), when governord said.
	Quota *governor.Denial
	// Rate names the rate that had no room and when it will (CauseRate).
	Rate *governor.RateLimitedError
	// Ended names the node that ended (CauseTaskEnded), when governord said.
	Ended *governor.TaskEndedError
	// Tenant is the tenant's state that refused the work (CauseSuspended,
	// CauseReadOnly, and a closing tenant's refused task as
	// CauseTaskEnded), when governord said.
	Tenant *governor.TenantStateError
	// Err is what went wrong underneath, if anything.
	Err error
}

func (d *Denial) Error() string {
	if d.Err != nil {
		return d.Cause.String() + ": " + d.Err.Error()
	}
	return d.Cause.String()
}

func (d *Denial) Unwrap() error { return d.Err }

// Governed reports whether the refusal is the sidecar's answer, marked as
// such on the wire (Governor-Denied): every cause but a client that went
// away, which sees nothing.
func (d *Denial) Governed() bool { return d.Cause != CauseCanceled }

// EstimateFit is a metered call's estimate that did not fit in what its
// quota had left.
type EstimateFit struct {
	Estimate int64  // the tokens the call asked to hold
	Input    int64  // the part of them that is its input
	Field    string // the request's output limit field
	Left     int64  // what the quota had left
}

// MaxOutput is the largest output limit that would have fit; 0 or less
// when the input alone does not.
func (f *EstimateFit) MaxOutput() int64 { return f.Left - f.Input }

// QuotaWait is an error of work that waited for quota units (held by other
// work in flight, or being recalled from other sidecars) when its wait
// ended: what it asked for, not a slot of its class, is what did not come.
type QuotaWait struct {
	Resource string
	Amount   int64
	Err      error
}

func (q *QuotaWait) Error() string {
	return fmt.Sprintf("waiting for %d %s: %v", q.Amount, q.Resource, q.Err)
}

func (q *QuotaWait) Unwrap() error { return q.Err }

// ErrWaitTimeout is the cause of a context from WithWaitTimeout that ran
// out: the work waited as long as it may.
var ErrWaitTimeout = errors.New("the wait timeout passed")

// WithWaitTimeout bounds an admission's wait by d, so that running out is
// told apart from a client that went away.
func WithWaitTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, ErrWaitTimeout)
}

// Deny is the one mapping from what went wrong while admitting work (an
// error of the Go SDK, or ctx ending) to a Denial. ctx is the admission's
// context; wait is its wait timeout, for the message.
func Deny(ctx context.Context, err error, class string, wait time.Duration) *Denial {
	var d *Denial
	if errors.As(err, &d) {
		if d.Cause == CauseWaitTimeout && wait > 0 {
			d.Wait = wait
		}
		return d
	}
	d = &Denial{Cause: CauseUnavailable, Class: class, Wait: wait, Err: err}
	errors.As(err, &d.Quota)
	errors.As(err, &d.Rate)
	errors.As(err, &d.Tenant)
	errors.As(err, &d.Ended)
	cause, named := causeFrom(governor.CauseOf(err))
	switch {
	case named:
		d.Cause = cause
	case errors.Is(err, governor.ErrInvalidArgument):
		// governord refused what the request asked as malformed: the
		// request's fault, not governord away.
		d.Cause = CauseBadRequest
	case errors.Is(err, governor.ErrTaskEnded):
		d.Cause = CauseTaskEnded
	case errors.Is(err, governor.ErrUnavailable), errors.Is(err, governor.ErrSessionLost), errors.Is(err, governor.ErrClosed),
		errors.Is(err, governor.ErrUnauthenticated):
		// governord could not be reached, or its session is gone: whatever
		// the clock says, that is governord away, not a full limit.
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrWaitTimeout),
		// governord may see the deadline (sent as grpc-timeout) a moment
		// before this process does.
		errors.Is(err, context.DeadlineExceeded):
		d.Cause = CauseWaitTimeout
		errors.As(err, &d.WaitedFor)
	case ctx.Err() != nil:
		d.Cause = CauseCanceled
	}
	return d
}

// Message is the denial as one sentence, for a person: it names the cap,
// the node, used/limit and the largest consumer of a spent quota, the class
// and the wait of a wait timeout, the node of an ended task. Both sides
// show it (in the HTTP body, in the SQL error).
func (d *Denial) Message() string {
	switch d.Cause {
	case CauseQuota:
		q := d.Quota
		if q == nil {
			return "governor: quota spent"
		}
		if f := d.Estimate; f != nil {
			s := fmt.Sprintf("governor: this call's estimate of %d %s does not fit: %s on %q has %d of %d left",
				f.Estimate, q.Resource, q.Resource, q.NodeName, f.Left, q.Limit)
			if f.MaxOutput() > 0 {
				return s + fmt.Sprintf("; set %s to at most %d", f.Field, f.MaxOutput())
			}
			return s + fmt.Sprintf("; its input alone is estimated at %d", f.Input)
		}
		s := fmt.Sprintf("governor: quota spent: %s on %q is %d of %d, this request asked %d more",
			q.Resource, q.NodeName, q.Used, q.Limit, q.Amount)
		switch {
		case q.LargestConsumerID != 0:
			s += fmt.Sprintf("; the largest consumer is %q with %d", q.LargestConsumerName, q.LargestConsumerUsed)
		case q.LargestConsumerName != "" && q.LargestConsumerUsed == 0: // a shared cap: "another tenant", no more
			s += "; the largest consumer is " + q.LargestConsumerName
		}
		return s
	case CauseWaitTimeout:
		if q := d.WaitedFor; q != nil {
			return fmt.Sprintf("governor: waited %v for %d %s; work in flight holds the rest of the budget until it settles, and not enough came back in time",
				d.Wait, q.Amount, q.Resource)
		}
		return fmt.Sprintf("governor: waited %v for a %q lease; the limit stayed full", d.Wait, d.Class)
	case CauseRate:
		if r := d.Rate; r != nil {
			return fmt.Sprintf("governor: over a rate: %s on %q is %d per %v, with %d left now and %d asked; there is room again in %v",
				r.Resource, r.NodeName, r.Units, r.Per, r.Level, r.Amount, r.RetryAfter.Round(time.Millisecond))
		}
		return "governor: over a rate; try again shortly"
	case CauseUnavailable:
		if err := d.Err; err != nil && (errors.Is(err, governor.ErrPermissionDenied) || errors.Is(err, governor.ErrNotFound)) {
			// governord answered: saying it cannot be reached would send an
			// operator to the network instead of the sidecar's key or task.
			return "governor: governord refused the sidecar's call (" + err.Error() + "), so no new work is admitted (fail closed)"
		}
		return "governor: governord cannot be reached, so no new work is admitted (fail closed)"
	case CauseTaskEnded:
		if e := d.Ended; e != nil {
			return fmt.Sprintf("governor: the task %q has ended (%s); it admits no more work", e.NodeName, StateName(e.State))
		}
		return "governor: the task has ended; it admits no more work"
	case CauseUnmatched:
		return "governor: no rule matches this request and http.unmatched is deny"
	case CauseStopping:
		return "governor: governor-proxy is shutting down and admits no new work"
	case CauseCanceled:
		return "governor: the client went away while it waited"
	case CauseSuspended, CauseReadOnly:
		s := "governor: the tenant is suspended; it admits no new work"
		if d.Cause == CauseReadOnly {
			s = "governor: the tenant is read-only; it admits no writes"
		}
		if t := d.Tenant; t != nil {
			s = fmt.Sprintf("governor: the tenant %q is %s; %s is refused", t.Tenant, strings.ReplaceAll(t.State, "_", "-"), t.Refused)
			if t.Reason != "" {
				s += " (" + t.Reason + ")"
			}
		}
		return s
	}
	if d.Err != nil {
		return "governor-proxy: " + d.Err.Error()
	}
	return "governor-proxy: bad request"
}

// StateName is how a node's end reads in a denial.
func StateName(s governor.NodeState) string {
	switch s {
	case governor.NodeClosed:
		return "closed"
	case governor.NodeCancelled:
		return "cancelled"
	case governor.NodeExpired:
		return "past its deadline"
	}
	return "ended"
}
