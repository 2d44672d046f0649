package httpproxy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/proxy/admission"
)

// The headers a governed response carries when Config.RateLimitHeaders is
// on: the IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers) for
// the tightest quota over the request, and Governor-Warning while any cap
// over it is near or over its cap.
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
	HeaderWarning         = "Governor-Warning"
)

// statusTimeout bounds the call that reads the caps' state for the headers.
const statusTimeout = 2 * time.Second

// addRateLimit adds the headers to h from governord's state of the caps
// over ex's node, as a caller of this sidecar can use them (the sidecar's
// own unspent reservations are left, not used); for a request of a rule in
// shadow, as enforcing the rule would meet them (its shadow ledger counts
// as spent). q is the cap and r what is left of it; a quota with a period
// adds t, the seconds until it resets (rounded up), and, for a period that
// is a duration, w, its length in seconds (a calendar period's length
// varies: no w). A quota that never refills has neither. A reading
// that fails leaves the headers out (counted): they inform, they never
// decide.
func (p *Proxy) addRateLimit(ctx context.Context, ex *exchange, h http.Header) {
	reader, ok := p.Admitter.(admission.CapReader)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	rep, err := reader.CapStatus(ctx, ex.subtask, ex.decision.Shadow || p.Config.Shadow)
	if err != nil {
		p.m.rateLimitErrors.Inc()
		p.log.Debug("governor-proxy: reading the caps' state for RateLimit headers failed", "rule", ex.rule, "err", err)
		return
	}
	rateLimitHeaders(h, rep, ex.decision, time.Now())
}

// rateLimitHeaders writes rep into h for a request under d: the tightest
// quota over the resources it charges (a metered one's too; any quota when
// it charges none), and the worst of the caps over it.
func rateLimitHeaders(h http.Header, rep admission.CapReport, d classify.Decision, now time.Time) {
	charged := d.Charges
	if d.Meter != nil {
		charged = maps.Clone(d.Charges)
		if charged == nil {
			charged = map[string]int64{}
		}
		charged[d.Meter.Resource] = 1
	}
	if c, ok := rep.Tightest(charged); ok {
		name := strconv.Quote(c.PolicyName())
		policy, limit := fmt.Sprintf("%s;q=%d", name, c.Cap), fmt.Sprintf("%s;r=%d", name, c.Remaining)
		if w, err := time.ParseDuration(c.Period); err == nil && w >= time.Second {
			policy += fmt.Sprintf(";w=%d", int64(w/time.Second))
		}
		if !c.ResetAt.IsZero() {
			limit += fmt.Sprintf(";t=%d", int64(max(c.ResetAt.Sub(now)+time.Second-1, 0)/time.Second))
		}
		h.Add(HeaderRateLimitPolicy, policy)
		h.Add(HeaderRateLimit, limit)
	}
	if c, ok := rep.Worst(charged, d.Class); ok {
		h.Set(HeaderWarning, c.Warning())
	}
}

// shadow dry-runs req instead of admitting it (a rule's mode: shadow, or
// the sidecar's): governord says how it would answer, nothing is charged
// or held, and the request goes on ungoverned. A would-be denial is
// logged and counted by rule and cause; a dry run that fails (governord
// away) is counted as "unavailable" and forwards all the same: shadow
// rules never refuse.
func (p *Proxy) shadow(ctx context.Context, ex *exchange, q classify.HTTPRequest, req admission.Request) {
	p.m.shadowRequests.WithLabelValues(ex.rule).Inc()
	cause, msg := "unavailable", "no dry run: the admitter cannot"
	if dr, ok := p.Admitter.(admission.DryRunner); ok {
		ctx, cancel := context.WithTimeout(ctx, statusTimeout)
		defer cancel()
		res, err := dr.DryRun(ctx, req)
		switch {
		case err != nil:
			msg = err.Error()
		case !res.Denied():
			p.logDecision(ex, q, "shadow_"+res.Outcome, 0)
			return
		default:
			cause, msg = res.Outcome, res.Message
		}
	}
	p.m.shadowDenials.WithLabelValues(ex.rule, cause).Inc()
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "decision",
		slog.String("kind", ex.kind), slog.String("rule", ex.rule), slog.String("class", ex.decision.Class),
		slog.String("subtask", ex.subtask), slog.String("outcome", "shadow_denied"), slog.String("cause", cause),
		slog.String("method", q.Method), slog.String("host", q.Host), slog.String("err", msg))
}
