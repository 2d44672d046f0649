package pgwire

import (
	"context"
	"log/slog"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/classify/sqlclass"
	"github.com/governor-project/governor/proxy/admission"
)

// askTimeout bounds a call to governord that is not an admission: the
// caps' state for a notice, a dry run, a write check.
const askTimeout = 2 * time.Second

// noticeCaps sends the client a NOTICE, before the statement's results,
// the first time a transaction runs near or over a cap over it (Proxy.Caps):
// the cap's state, node and use, as Governor-Warning says it over HTTP. A
// statement outside a transaction block is a transaction of its own. A
// reading that fails sends nothing: notices inform, they never decide.
// The machine says when one is due (admitReq.noticeDue); noticeCaps
// reports whether it sent one.
func (c *conn) noticeCaps(subtask string) bool {
	if c.p.Caps == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(c.ctx, askTimeout)
	defer cancel()
	rep, err := c.p.Caps.CapStatus(ctx, subtask, false)
	if err != nil {
		return false
	}
	worst, ok := rep.Worst(nil, "") // every cap over the subtask: the transaction's statements are not known yet
	if !ok {
		return false
	}
	c.writeClient(noticeResponse("governor: "+capWords(worst)+" ("+worst.Warning()+")"), true)
	return true
}

// capWords says a cap's state in words.
func capWords(c admission.CapState) string {
	what := "quota " + c.Name
	if c.Limit {
		what = "limit " + c.Name
	}
	switch c.State {
	case admission.StateNear:
		return what + " on " + c.Node + " is near its cap"
	case admission.StateSoftExceeded:
		return what + " on " + c.Node + " is over its cap"
	}
	if !c.ResetAt.IsZero() {
		return what + " on " + c.Node + " is at its cap: new work is refused until it resets at " + c.ResetAt.UTC().Format(time.RFC3339)
	}
	return what + " on " + c.Node + " is at its cap: new work is refused"
}

// writes reports whether a message's statements may write, as a read-only
// tenant refuses: a statement of a write kind. A Query decided by its
// connection alone (byConnection) is asked about classified all the same
// when this is needed: its lease did not need the text, but a read_only
// tenant's refusal does, and a SELECT must not read as a write.
func (c *conn) writes(run []sqlclass.Statement) bool {
	for i := range run {
		if classify.WritesSQL(c.statement(&run[i]).Kinds) {
			return true
		}
	}
	return false
}

// shadow dry-runs the asks of rules in dry run (Proxy.Shadow, or a rule's
// mode: shadow) and returns the others, to be admitted. A would-be denial
// is logged and counted by rule and cause; nothing is charged or held for
// a shadow ask, and its statements run all the same.
func (c *conn) shadow(asks []ask) []ask {
	kept := asks[:0]
	for _, a := range asks {
		if !c.p.Shadow && !a.d.Shadow {
			kept = append(kept, a)
			continue
		}
		cause, msg := "unavailable", "no dry run: Proxy.DryRun is nil"
		if c.p.DryRun != nil {
			ctx, cancel := context.WithTimeout(c.ctx, askTimeout)
			res, err := c.p.DryRun.DryRun(ctx, a.req)
			cancel()
			switch {
			case err != nil:
				msg = err.Error()
			case !res.Denied():
				continue
			default:
				cause, msg = res.Outcome, res.Message
			}
		}
		if c.p.Metrics != nil {
			c.p.Metrics.shadow.WithLabelValues(a.d.Rule, cause).Inc()
		}
		if c.p.Logger != nil {
			c.p.Logger.LogAttrs(context.Background(), slog.LevelInfo, "decision",
				slog.String("kind", "pgwire"), slog.String("rule", a.d.Rule), slog.String("class", a.req.Class),
				slog.String("subtask", a.req.Subtask), slog.String("outcome", "shadow_denied"), slog.String("cause", cause),
				slog.String("database", c.database), slog.String("err", msg))
		}
	}
	return kept
}
