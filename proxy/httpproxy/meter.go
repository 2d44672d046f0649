package httpproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/meter"
)

// metered is the metering of one LLM call a meter: rule matched: the
// estimate held for it, and how to read its response.
type metered struct {
	rule     *classify.Meter
	api      meter.API
	estimate int64
	input    int64         // the estimate's input part
	req      meter.Request // what the body said
	body     []byte        // the body forwarded
	clamped  string        // "field=N" once on_over_estimate: clamp lowered the output limit
	strip    bool          // include_usage was added: take it out of the stream again
	settled  bool
}

// Settlement outcomes, the "outcome" label of governor_proxy_meter_settlements_total.
const (
	settledUsage     = "usage"     // settled to the usage the response reported
	settledNoUsage   = "no_usage"  // none reported (dropped stream, upstream error, client gone): the reservation is spent
	settledUnmetered = "unmetered" // a body over max_body let through by oversize: unmetered
)

// prepareMeter reads the request body (up to the rule's max_body), works
// out the estimate to hold, and asks an OpenAI stream for its usage where it
// would not report it. A nil result with no error is a request let through
// unmetered. The body is put back for forwarding.
func (p *Proxy) prepareMeter(r *http.Request, ex *exchange, m *classify.Meter) (*metered, error) {
	api, err := meter.ParseAPI(m.API)
	if err != nil {
		return nil, &admission.Denial{Cause: admission.CauseBadRequest, Err: err}
	}
	if ex.kind == "connect" {
		return nil, &admission.Denial{Cause: admission.CauseBadRequest,
			Err: fmt.Errorf("rule %q meters LLM calls, which a CONNECT tunnel hides; point the client's base URL at a route instead", ex.rule)}
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		body, err = io.ReadAll(io.LimitReader(r.Body, m.MaxBody+1))
		if err != nil {
			return nil, &admission.Denial{Cause: admission.CauseCanceled, Err: fmt.Errorf("reading the request body: %w", err)}
		}
	}
	if int64(len(body)) > m.MaxBody {
		if !m.Unmetered {
			return nil, &admission.Denial{Cause: admission.CauseBadRequest,
				Err: fmt.Errorf("the request body is over the %d bytes rule %q meters (meter.max_body), and meter.oversize is refuse", m.MaxBody, ex.rule)}
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		p.m.meterSettlements.WithLabelValues(ex.rule, settledUnmetered).Inc()
		return nil, nil
	}
	est, err := EstimateCall(m, body)
	if err != nil {
		return nil, &admission.Denial{Cause: admission.CauseBadRequest, Err: fmt.Errorf("rule %q meters LLM calls: %w", ex.rule, err)}
	}
	req := est.Request
	mt := &metered{rule: m, api: api, req: req, estimate: est.Tokens, input: est.Input}
	if api == meter.OpenAI && meter.AsksUsage(r.URL.Path, req) {
		// Without it an OpenAI stream reports no usage, and every stream
		// would be charged its whole estimate.
		if b, err := meter.AddIncludeUsage(body); err == nil {
			body, mt.strip = b, true
		}
	}
	setBody(r, body)
	mt.body = body
	return mt, nil
}

// CallEstimate is what the sidecar holds for one metered call.
type CallEstimate struct {
	Request meter.Request // what the body said
	Tokens  int64         // the estimate held, of the meter's resource
	Input   int64         // its input part, from the body's size
}

// EstimateCall works out what the sidecar holds for a call under meter m
// whose body (within m.MaxBody) is body: its input at a token per
// m.BytesPerToken bytes, and the output limit it names or m.Reserve. An
// error is a body the meter cannot read, which the sidecar refuses (400).
// governor explain -live asks governord with it, as the sidecar asks.
func EstimateCall(m *classify.Meter, body []byte) (CallEstimate, error) {
	req, err := meter.ReadRequest(body)
	if err != nil {
		return CallEstimate{}, err
	}
	return CallEstimate{Request: req, Tokens: meter.Estimate(req, len(body), int(m.BytesPerToken), m.Reserve),
		Input: meter.InputEstimate(len(body), int(m.BytesPerToken))}, nil
}

// MeteredCharges are the charges of a metered call under d's rule: the
// rule's own, and tokens of the meter's resource.
func MeteredCharges(d classify.Decision, tokens int64) map[string]int64 {
	charges := make(map[string]int64, len(d.Charges)+1)
	maps.Copy(charges, d.Charges)
	charges[d.Meter.Resource] = tokens
	return charges
}

// overEstimate looks again at a metered call refused for quota: when the
// quota still had room, the call's estimate, not the budget, is what did
// not fit. The denial then says what would fit; with on_over_estimate:
// clamp, the call's output limit is lowered to that and it is admitted
// again, within what is left of its wait. It returns the ticket of a call
// admitted so, or the denial to send.
func (p *Proxy) overEstimate(ctx context.Context, r *http.Request, ex *exchange, den *admission.Denial, write bool) (admission.Ticket, *admission.Denial) {
	mt := ex.meter
	q := den.Quota
	if den.Cause != admission.CauseQuota || q == nil || q.Resource != mt.rule.Resource || q.Limit-q.Used <= 0 {
		return nil, den
	}
	fit := &admission.EstimateFit{Estimate: mt.estimate, Input: mt.input, Field: meter.OutputField(mt.api, r.URL.Path, mt.req),
		Left: q.Limit - q.Used}
	den.Estimate = fit
	if !mt.rule.Clamp || fit.MaxOutput() < 1 {
		return nil, den
	}
	body, err := meter.SetOutputLimit(mt.body, fit.Field, fit.MaxOutput())
	if err != nil {
		return nil, den
	}
	setBody(r, body)
	mt.body, mt.estimate = body, fit.MaxOutput()+mt.input
	mt.clamped = fmt.Sprintf("%s=%d", fit.Field, fit.MaxOutput())
	t, err := p.Admitter.Admit(ctx, mt.request(ex.subtask, ex.decision, write))
	if err != nil {
		return nil, admission.Deny(ctx, err, ex.decision.Class, p.waitTimeout())
	}
	p.log.Info("governor-proxy: a metered call's output limit was lowered to what the budget can cover (on_over_estimate: clamp)",
		"rule", ex.rule, "subtask", ex.subtask, "clamped", mt.clamped, "left", fit.Left)
	return t, nil
}

// setBody makes body the request's body, with its length.
func setBody(r *http.Request, body []byte) {
	if r.Body != nil {
		r.Body.Close()
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	if len(body) > 0 {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
}

// request is the admission request of a metered call: the rule's charges,
// and the estimate held on the metered resource; write as the call is
// classified.
func (mt *metered) request(subtask string, d classify.Decision, write bool) admission.Request {
	return admission.Request{Subtask: subtask, Class: d.Class, Charges: MeteredCharges(d, mt.estimate), Held: true, Write: write, DenyRate: d.DenyRate}
}

// meterBody wraps an admitted call's response body so that its usage is read
// as the client reads it, and the held estimate settled to it when it ends.
func (p *Proxy) meterBody(ex *exchange, resp *http.Response) {
	mt := ex.meter
	opts := meter.BodyOptions{API: mt.api, Format: meter.FormatOf(resp.Header.Get("Content-Type")), Strip: mt.strip,
		MaxJSON: int(mt.rule.MaxBody)}
	resp.Body = meter.NewBody(resp.Body, opts, func(u meter.Usage, ok bool) { p.settle(ex, u, ok) })
	if mt.strip && opts.Format == meter.FormatSSE {
		resp.ContentLength = -1 // the stream loses what was added
		resp.Header.Del("Content-Length")
	}
}

// settle settles a metered call's ticket: to the usage its response
// reported, or (none reported) to what was held.
func (p *Proxy) settle(ex *exchange, u meter.Usage, ok bool) {
	mt := ex.meter
	if mt == nil || mt.settled {
		return
	}
	mt.settled = true
	used := maps.Clone(ex.decision.Charges)
	if used == nil {
		used = map[string]int64{}
	}
	used[mt.rule.Resource] = mt.estimate
	outcome := settledNoUsage
	if ok {
		used[mt.rule.Resource] = u.Tokens(mt.api)
		outcome = settledUsage
	}
	p.m.meterSettlements.WithLabelValues(ex.rule, outcome).Inc()
	if over := used[mt.rule.Resource] - mt.estimate; over > 0 {
		// The provider's word against the estimate: believed, since it is
		// what the provider bills, and charged as far as the caps allow;
		// but said, since a call should not use more than its estimate
		// (docs/metering.md).
		p.m.meterOver.WithLabelValues(ex.rule).Inc()
		p.m.meterOverTokens.WithLabelValues(ex.rule).Add(float64(over))
		p.log.Warn("governor-proxy: the provider reported more tokens than the call's estimate; the rest is charged as far as the caps allow",
			"rule", ex.rule, "subtask", ex.subtask, "estimate", mt.estimate, "reported", used[mt.rule.Resource])
	}
	p.m.meterTokens.WithLabelValues(ex.rule).Add(float64(min(used[mt.rule.Resource], mt.estimate)))
	if s, isSettler := ex.ticket.(admission.Settler); isSettler {
		s.Settle(used)
	}
}

// providerDenial is a denial of a metered call in its provider's error
// shape, so that the provider's SDK raises its own error for the status
// (429: its rate-limit error, which x-should-retry: false keeps it from
// retrying): OpenAI's {"error": {...}}, which the proxy's body already is,
// with the cause as its code; Anthropic's {"type": "error", "error":
// {...}}.
func providerDenial(api meter.API, resp *http.Response) *http.Response {
	if resp.Body == nil {
		return resp
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	var b struct {
		Error map[string]any `json:"error"`
	}
	if err != nil || json.Unmarshal(raw, &b) != nil || b.Error == nil {
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		return resp
	}
	var out any
	switch api {
	case meter.Anthropic:
		out = map[string]any{"type": "error", "error": b.Error}
	default:
		b.Error["code"] = b.Error["cause"]
		b.Error["param"] = nil
		out = b
	}
	body, err := json.Marshal(out)
	if err != nil {
		body = raw
	}
	body = append(body, '\n')
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	return resp
}
