package budget

import (
	"context"
	"errors"
	"sync"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// Refusals the sidecar decides by itself (a delegated slot not free within
// the wait timeout, a reservation that could not grow, an ended subtask,
// governord out of reach) are counted by node and cause and reported to
// governord with the session's ticks, so that governor usage shows them
// beside governord's own. A refusal that a call of governord decided
// (Consume, Acquire, ChargeAndAcquire) is counted there already: its error
// is marked countedAtGovernord and not reported again.

// maxPendingDenials bounds the node and cause pairs kept while governord
// cannot be told; what does not fit is counted only in the sidecar's
// metrics.
const maxPendingDenials = 10_000

// maxDenialsPerReport is what governord takes in one ReportDenials.
const maxDenialsPerReport = 1000

type denialKey struct {
	node  int64
	cause string
}

// localDenials are the refusals not yet reported.
type localDenials struct {
	mu      sync.Mutex
	pending map[denialKey]int64
}

func (l *localDenials) add(node int64, cause string, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := denialKey{node, cause}
	if _, ok := l.pending[k]; !ok && len(l.pending) >= maxPendingDenials {
		return
	}
	if l.pending == nil {
		l.pending = map[denialKey]int64{}
	}
	l.pending[k] += n
}

// take returns up to one report's worth of pending counts and forgets them.
func (l *localDenials) take() []governor.DenialCount {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []governor.DenialCount
	for k, n := range l.pending {
		if len(out) == maxDenialsPerReport {
			break
		}
		out = append(out, governor.DenialCount{Node: k.node, Cause: k.cause, Count: n})
		delete(l.pending, k)
	}
	return out
}

// countedAtGovernord marks a refusal governord answered and counted.
type countedAtGovernord struct{ err error }

func (e *countedAtGovernord) Error() string { return e.err.Error() }
func (e *countedAtGovernord) Unwrap() error { return e.err }

// counted marks err, from a call that governord counts the refusals of.
func counted(err error) error {
	if err == nil {
		return nil
	}
	return &countedAtGovernord{err}
}

// noteDenial counts a refusal of work on node for usage, unless governord
// counted it already or it is no refusal of governed work (the client went
// away, the sidecar is stopping).
func (a *Admitter) noteDenial(node int64, err error, d *admission.Denial) {
	var c *countedAtGovernord
	if node == 0 || errors.As(err, &c) || d.Cause == admission.CauseCanceled || d.Cause == admission.CauseStopping {
		return
	}
	resource := ""
	if d.Quota != nil {
		resource = d.Quota.Resource
	}
	a.local.add(node, governor.Cause(d.Cause).UsageName(resource), 1)
}

// reportDenials sends the pending counts to governord in the background;
// counts it could not send stay pending for the next tick.
func (s *session) reportDenials() {
	ds := s.a.local.take()
	if len(ds) == 0 {
		return
	}
	s.a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(s.life, callTimeout)
		defer cancel()
		err := s.client.ReportDenials(ctx, ds)
		switch {
		case err == nil:
		case errors.Is(err, governor.ErrInvalidArgument), errors.Is(err, governor.ErrNotFound), errors.Is(err, governor.ErrPermissionDenied):
			// Sent again it would be refused again, and hold up every
			// later report with it (a node reclaimed since, a name
			// governord will not take): dropped.
			s.a.log.Warn("governor-proxy: governord refused a report of refusals for usage; it is dropped", "err", err, "counts", len(ds))
		default:
			for _, d := range ds {
				s.a.local.add(d.Node, d.Cause, d.Count)
			}
			s.a.log.Debug("governor-proxy: reporting refusals for usage failed; they go with the next report", "err", err)
		}
	})
}
