package httpproxy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
	"go.opentelemetry.io/otel/trace"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/meter"
)

// exchange is one plain HTTP request, or one CONNECT tunnel, from its
// arrival to its end. goproxy carries it from the request hook to the round
// trip and the response hook in ProxyCtx.UserData.
type exchange struct {
	kind     string // "http" or "connect"
	subtask  string
	rule     string // the matching rule, or ruleUnmatched
	decision classify.Decision
	ticket   admission.Ticket // nil when none is held
	local    bool             // the response is the proxy's own: keep its Governor-Denied
	meter    *metered         // a metered LLM call; nil otherwise
	shadowed bool             // its rule is in dry run: nothing is charged, before or after
	// A bytes rule's charges (bytes.go): the request body's length charged
	// with the admission, and the bodies charged as they stream.
	upfront             int64
	reqBytes, respBytes *byteMeter
}

// governed reports whether a rule admitted the exchange: a slot held or
// quota charged.
func (ex *exchange) governed() bool {
	return ex.ticket != nil || len(ex.decision.Charges) > 0 || ex.meter != nil
}

// end ends the exchange's ticket, if it holds one.
func (ex *exchange) end(latency time.Duration, overloaded bool) {
	if ex.ticket != nil {
		ex.ticket.End(latency, overloaded)
	}
}

// decide classifies q, reads the subtask from Proxy-Authorization when the
// matching rule governs it (a class, a charge or a charge from a header),
// and admits it as the rule says. A non-nil error is an *admission.Denial
// or a *refusal: the request must not go on, and the error says how to
// answer.
//
// Proxy-Authorization is read only when the subtask is needed: the worker
// may have inherited credentials for another proxy (Bearer, say), which
// must not stop traffic the rules do not govern.
func (p *Proxy) decide(ctx context.Context, r *http.Request, q classify.HTTPRequest, ex *exchange) (err error) {
	traced := tracing.Enabled()
	if traced {
		reqCtx := ctx // the request's span, not a step's
		defer func() { traceDecision(reqCtx, ex, err) }()
	}
	d, ok := p.match(ctx, q, traced)
	if !ok {
		ex.rule = ruleUnmatched
		if p.Config.DenyUnmatched {
			den := &admission.Denial{Cause: admission.CauseUnmatched}
			p.deny(ex, q, den, 0)
			return den
		}
		p.logDecision(ex, q, "ungoverned", 0)
		return nil
	}
	ex.decision, ex.rule = d, d.Rule
	admits := d.Class != "" || len(d.Charges) > 0 || d.Meter != nil || d.Bytes != nil
	if !admits && d.ChargeFromHeader == nil {
		p.logDecision(ex, q, "ungoverned", 0)
		return nil
	}
	subtask, err := subtaskName(r.Header)
	if err != nil {
		den := &admission.Denial{Cause: admission.CauseBadRequest, Err: err}
		p.deny(ex, q, den, 0)
		return den
	}
	ex.subtask = subtask
	if d.Shadow || p.Config.Shadow { // dry run: asked about, never charged, always forwarded
		ex.shadowed = true
		p.shadow(ctx, ex, q, admission.Request{Subtask: subtask, Class: d.Class, Charges: d.Charges, Write: classify.WritesHTTP(q.Method, d)})
		return nil
	}
	if !admits { // charged from a response header, after the response
		p.logDecision(ex, q, "ungoverned", 0)
		return nil
	}
	if traced {
		var span trace.Span
		ctx, span = traceStep(ctx, "admission")
		defer span.End()
	}
	return p.admit(ctx, r, q, ex)
}

// match finds the rule that decides q, if any.
func (p *Proxy) match(ctx context.Context, q classify.HTTPRequest, traced bool) (classify.Decision, bool) {
	rules := p.rules()
	if rules == nil {
		return classify.Decision{}, false
	}
	var span trace.Span
	if traced {
		_, span = traceStep(ctx, "classify")
	}
	d, ok := rules.MatchHTTP(q)
	if traced {
		span.End()
	}
	return d, ok
}

// admit takes what the exchange's rule asks for, the subtask's: its meter's
// estimate, a slot of its class and its charges. It tries the Admitter's
// fast path first, and only when that says no waits, up to the wait
// timeout. A non-nil error is the *admission.Denial the exchange ends with.
func (p *Proxy) admit(ctx context.Context, r *http.Request, q classify.HTTPRequest, ex *exchange) error {
	d := ex.decision
	req := admission.Request{Subtask: ex.subtask, Class: d.Class, Charges: d.Charges, Write: classify.WritesHTTP(q.Method, d), DenyRate: d.DenyRate}
	if d.Meter != nil {
		mt, err := p.prepareMeter(r, ex, d.Meter)
		if err != nil {
			den := err.(*admission.Denial)
			p.deny(ex, q, den, 0)
			return den
		}
		if ex.meter = mt; mt != nil {
			req = mt.request(ex.subtask, d, req.Write)
		}
	}
	if n, err := upfrontBytes(r, d); err != nil {
		p.deny(ex, q, err.(*admission.Denial), 0)
		return err
	} else if n > 0 {
		req.Charges, ex.upfront = withBytes(d.Charges, d.Bytes.Resource, n), n
	}
	if f, ok := p.Admitter.(admission.Fast); ok {
		if t, ok := f.TryAdmit(req); ok {
			p.m.leaseWait.WithLabelValues(d.Class).Observe(0)
			ex.ticket = t
			p.logDecision(ex, q, "admitted", 0)
			return nil
		}
	}
	wait := p.waitTimeout()
	wctx, cancel := admission.WithWaitTimeout(ctx, wait)
	defer cancel()
	began := time.Now()
	t, err := p.Admitter.Admit(wctx, req)
	if err != nil && ex.upfront > 0 && chargedAsItStreams(admission.Deny(wctx, err, d.Class, wait), d.Bytes.Resource) {
		// A rate has no room for the whole body at once: it is charged,
		// and paced, as it streams.
		req.Charges, ex.upfront = d.Charges, 0
		t, err = p.Admitter.Admit(wctx, req)
	}
	waited := time.Since(began)
	p.m.leaseWait.WithLabelValues(d.Class).Observe(waited.Seconds())
	if err != nil {
		den := admission.Deny(wctx, err, d.Class, wait)
		if ex.meter != nil {
			t, den = p.overEstimate(wctx, r, ex, den, req.Write)
		}
		if den != nil {
			p.deny(ex, q, den, waited)
			return den
		}
	}
	ex.ticket = t
	p.logDecision(ex, q, "admitted", waited)
	return nil
}

// deny counts and logs a denial.
func (p *Proxy) deny(ex *exchange, q classify.HTTPRequest, d *admission.Denial, wait time.Duration) {
	ex.local = true
	switch d.Cause {
	case admission.CauseCanceled:
		p.finish(ex, outcomeCanceled)
	case admission.CauseBadRequest:
		p.m.denials.WithLabelValues(d.Cause.String()).Inc()
		p.finish(ex, outcomeRefused)
	default:
		p.m.denials.WithLabelValues(denial{d}.wireCause()).Inc()
		p.finish(ex, outcomeDenied)
	}
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "decision",
		slog.String("kind", ex.kind), slog.String("rule", ex.rule), slog.String("class", ex.decision.Class),
		slog.String("subtask", ex.subtask), slog.String("outcome", "denied"), slog.String("cause", d.Cause.String()),
		slog.Duration("wait", wait), slog.String("method", q.Method), slog.String("host", q.Host),
		slog.String("err", d.Error()))
}

// logDecision logs a request that went on, at debug level: a busy worker
// makes thousands a second, and denials are logged at info (deny).
func (p *Proxy) logDecision(ex *exchange, q classify.HTTPRequest, outcome string, wait time.Duration) {
	if !p.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	p.log.LogAttrs(context.Background(), slog.LevelDebug, "decision",
		slog.String("kind", ex.kind), slog.String("rule", ex.rule), slog.String("class", ex.decision.Class),
		slog.String("subtask", ex.subtask), slog.String("outcome", outcome), slog.Duration("wait", wait),
		slog.String("method", q.Method), slog.String("host", q.Host))
}

// finish counts the request once, by rule and outcome.
func (p *Proxy) finish(ex *exchange, outcome string) {
	p.m.requests.WithLabelValues(ex.rule, outcome).Inc()
}

// onRequest is goproxy's request hook for plain HTTP (and routed) requests.
func (p *Proxy) onRequest(r *http.Request, pctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	ex := &exchange{kind: "http"}
	pctx.UserData = ex
	pctx.RoundTripper = goproxy.RoundTripperFunc(p.roundTrip)
	if err := p.dialer.refuseLiteral(r.Context(), r.URL.Host, defaultPort(r.URL.Scheme)); err != nil {
		ex.rule, ex.local = ruleUnmatched, true
		p.refused(ex, r.URL.Host, err)
		return r, localFor(r, asResponder(err).response(r))
	}
	if err := p.decide(r.Context(), r, classify.HTTPRequestFrom(r), ex); err != nil {
		ex.local = true
		resp := asResponder(err).response(r)
		if m := ex.decision.Meter; m != nil {
			if api, err := meter.ParseAPI(m.API); err == nil {
				resp = providerDenial(api, resp)
			}
		}
		return r, localFor(r, resp)
	}
	// It was for this proxy (goproxy strips it too, unless told to keep it).
	r.Header.Del("Proxy-Authorization")
	if b := ex.decision.Bytes; b != nil && b.Request && !ex.shadowed {
		p.requestBytes(r, ex)
	}
	return r, nil
}

// localFor is a response the proxy makes itself, in the form r's client
// reads: a gRPC status for a gRPC call (grpc.go), as it is otherwise.
func localFor(r *http.Request, resp *http.Response) *http.Response {
	if isGRPC(r) {
		return grpcDenial(resp)
	}
	return resp
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// roundTrip forwards an admitted request. The lease is released when the
// response body ends or is closed (the client finished, or went away), or
// at once if the upstream failed. The body is wrapped here, before goproxy
// keeps its reference, so goproxy sees the body it got and keeps
// Content-Length.
func (p *Proxy) roundTrip(req *http.Request, pctx *goproxy.ProxyCtx) (*http.Response, error) {
	ex := pctx.UserData.(*exchange)
	if tracing.Enabled() {
		var span trace.Span
		req, span = traceUpstream(req)
		defer span.End() // at the response's headers
	}
	start := time.Now()
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		p.settle(ex, meter.Usage{}, false)
		ex.end(0, false)
		if den := ex.cutDenial(); den != nil { // the request's body was cut: say why
			return p.bytesDenied(req, ex, den), nil
		}
		return nil, err
	}
	latency := time.Since(start)
	if b := ex.decision.Bytes; b != nil && b.Response && !ex.shadowed && resp.StatusCode != http.StatusSwitchingProtocols && bodyAllowed(req, resp) {
		if den := p.responseBytes(req, ex, resp); den != nil {
			ex.end(latency, false)
			return p.bytesDenied(req, ex, den), nil
		}
	}
	p.m.upstream.WithLabelValues(ex.rule).Observe(latency.Seconds())
	p.finish(ex, outcomeForwarded)
	// Only the proxy says Governor-Denied, Governor-Warning and
	// Governor-Clamped.
	resp.Header.Del(HeaderDenied)
	resp.Header.Del(HeaderWarning)
	resp.Header.Del(HeaderClamped)
	if ex.meter != nil && ex.meter.clamped != "" {
		resp.Header.Set(HeaderClamped, ex.meter.clamped)
	}
	if p.Config.RateLimitHeaders && ex.governed() {
		p.addRateLimit(req.Context(), ex, resp.Header)
	}
	overloaded := governor.Overloaded(resp)
	if hc := ex.decision.ChargeFromHeader; hc != nil && !ex.shadowed {
		p.chargeFromHeader(ex, hc, resp.Header)
	}
	if ex.meter != nil {
		p.meterBody(ex, resp)
	}
	body := &leaseBody{rc: resp.Body, resp: resp, release: func() { ex.end(latency, overloaded) }}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		rw, ok := resp.Body.(io.ReadWriteCloser)
		client, _ := req.Context().Value(clientConnKey{}).(net.Conn)
		if !ok || client == nil {
			resp.Body.Close()
			ex.end(latency, false)
			return nil, errors.New("the upstream switched protocols on a connection that cannot be relayed")
		}
		// goproxy relays the upgraded connection until one side ends,
		// then closes this body; closing the client too ends the relay.
		up := &upgradedBody{leaseBody: body, w: rw, client: client}
		up.untrack = p.tunnels.untracker(up) // set before a shutdown can close it
		p.tunnels.register(up)
		resp.Body = up
		return resp, nil
	}
	resp.Body = body
	return resp, nil
}

func (p *Proxy) chargeFromHeader(ex *exchange, hc *classify.HeaderCharge, h http.Header) {
	n, err := hc.Amount(h)
	switch {
	case errors.Is(err, classify.ErrHeaderMissing):
		p.m.headerCharges.WithLabelValues(ex.rule, "missing").Inc()
	case err != nil:
		p.m.headerCharges.WithLabelValues(ex.rule, "not_a_number").Inc()
		p.log.Warn("governor-proxy: charge_from_header: not a number; nothing charged", "rule", ex.rule, "err", err)
	default:
		// The upfront charge of the same resource, if any, was an estimate
		// taken at admission (it is what refuses requests once the budget
		// is spent); the header settles the rest, in the background: the
		// response has been served, so what was spent was spent, up to
		// what the quota has left.
		if n -= ex.decision.Charges[hc.Resource]; n > 0 {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), headerChargeTimeout)
				defer cancel()
				_, err := p.Admitter.Admit(ctx, admission.Request{Subtask: ex.subtask, Charges: map[string]int64{hc.Resource: n}, Spent: true})
				outcome := "charged"
				if err != nil {
					outcome = "failed"
					p.log.Warn("governor-proxy: charge after the response failed", "rule", ex.rule, "resource", hc.Resource, "amount", n, "err", err)
				}
				p.m.headerCharges.WithLabelValues(ex.rule, outcome).Inc()
			}()
		}
	}
}

// headerChargeTimeout bounds a charge read from a response header.
const headerChargeTimeout = 10 * time.Second

// onResponse is goproxy's response hook. resp is nil when the upstream
// failed: that becomes a 502, or a 504 on a timeout, instead of goproxy's
// 500. A body of unknown length is marked chunked, which makes goproxy flush
// each piece as it arrives: SSE, NDJSON and any other stream.
func (p *Proxy) onResponse(resp *http.Response, pctx *goproxy.ProxyCtx) *http.Response {
	ex, _ := pctx.UserData.(*exchange)
	if ex == nil || ex.local {
		return resp
	}
	if resp == nil {
		ex.local = true
		ref := upstreamRefusal(pctx.Error)
		p.finish(ex, ref.outcome(pctx.Req))
		if ref.cause != "" {
			p.m.denials.WithLabelValues(ref.cause).Inc()
		}
		p.log.Info("upstream failed", "rule", ex.rule, "subtask", ex.subtask, "host", pctx.Req.URL.Host,
			"status", ref.code, "err", pctx.Error)
		return localFor(pctx.Req, ref.response(pctx.Req))
	}
	if resp.ContentLength < 0 && resp.StatusCode != http.StatusSwitchingProtocols && bodyAllowed(pctx.Req, resp) {
		resp.Header.Set("Transfer-Encoding", "chunked")
	}
	return resp
}

func bodyAllowed(req *http.Request, resp *http.Response) bool {
	if req != nil && req.Method == http.MethodHead {
		return false
	}
	return !(resp.StatusCode >= 100 && resp.StatusCode <= 199) &&
		resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified
}

// leaseBody releases the lease once the body is read to its end, fails, or
// is closed, whichever is first. Reads pass straight through.
type leaseBody struct {
	rc      io.ReadCloser
	resp    *http.Response
	release func()
	once    sync.Once
}

func (b *leaseBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		if err == io.EOF {
			// Trailers arrive with the end of the body; strip a spoofed
			// Governor-Denied there too.
			b.resp.Trailer.Del(HeaderDenied)
		}
		b.done()
		var cut *errBytesCut
		if errors.As(err, &cut) {
			// A bytes rule cut the body. goproxy reads it in the handler,
			// and would end a chunked body as if it were complete: abort
			// the response instead (the connection, or the HTTP/2 stream).
			panic(http.ErrAbortHandler)
		}
	}
	return n, err
}

func (b *leaseBody) Close() error {
	err := b.rc.Close()
	b.done()
	return err
}

func (b *leaseBody) done() { b.once.Do(b.release) }

// upgradedBody is the body of a 101 Switching Protocols (a websocket): the
// upstream connection itself. Closing it ends the relay, releases the lease
// and closes the client's connection, which goproxy leaves open.
type upgradedBody struct {
	*leaseBody
	w         io.Writer
	client    net.Conn
	untrack   func()
	closeOnce sync.Once
}

func (b *upgradedBody) Write(p []byte) (int, error) { return b.w.Write(p) }

func (b *upgradedBody) Close() error {
	err := b.leaseBody.Close()
	b.closeOnce.Do(func() {
		b.client.Close()
		b.untrack()
	})
	return err
}

type clientConnKey struct{}

// subtaskName reads the subtask from Proxy-Authorization: the username of
// Basic credentials ("crawl-42:" with an empty password). No header means
// the worker's task itself.
func subtaskName(h http.Header) (string, error) {
	v := h.Get("Proxy-Authorization")
	if v == "" {
		return "", nil
	}
	scheme, cred, _ := strings.Cut(strings.TrimSpace(v), " ")
	if !strings.EqualFold(scheme, "Basic") {
		return "", errors.New("Proxy-Authorization must be Basic credentials whose username names the subtask, e.g. http://crawl-42:@proxy")
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", errors.New("Proxy-Authorization: the Basic credentials are not base64")
	}
	user, _, _ := strings.Cut(string(dec), ":")
	if err := admission.CheckSubtaskName(user); err != nil {
		return "", fmt.Errorf("Proxy-Authorization: the subtask name %w", err)
	}
	return user, nil
}
