package httpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// HeaderDenied is the header that marks a response as the proxy's denial.
// Only the proxy sets it: it is removed from every upstream response.
const HeaderDenied = "Governor-Denied"

// HeaderClamped, on the response to a metered call whose output limit
// on_over_estimate: clamp lowered, says to what: "max_tokens=312".
const HeaderClamped = "Governor-Clamped"

// retryAfter is the Retry-After sent with 503 denials: soon, since the
// client will queue again anyway.
const retryAfter = "1"

// The Governor-Denied values of the proxy's own refusals, which are not
// admission decisions (package admission's causes are) but are the proxy's
// answer all the same.
const (
	// causeForbiddenTarget: a target the proxy does not reach (the proxy
	// itself, governord, loopback, link-local or metadata addresses, a
	// CONNECT port outside http.connect_ports).
	causeForbiddenTarget = "forbidden-target"
	// causeProxyAuth: Proxy-Authorization lacks the password http.password
	// names (407).
	causeProxyAuth = "proxy-auth"
)

// denial renders a refusal of the admission layer as HTTP: its status,
// Governor-Denied value and retry headers as admission's table of causes
// says (Cause.Wire), and here the CONNECT status line and the JSON body.
type denial struct{ *admission.Denial }

// wireCause is the Governor-Denied value (admission's table of causes);
// a client gone away, which is sent nothing, is named for the log.
func (d denial) wireCause() string {
	if h := d.Cause.Wire().Header; h != "" {
		return h
	}
	return d.Cause.String()
}

func (d denial) status() int { return d.Cause.Wire().Status }

// reason is the reason phrase of a CONNECT denial's status line, which is
// all most clients show of a failed tunnel, e.g.
//
//	Governor quota spent: llm_calls on "pod-7"
func (d denial) reason() string {
	switch d.Cause {
	case admission.CauseQuota:
		if q := d.Quota; q != nil {
			return fmt.Sprintf("Governor quota spent: %s on %q", q.Resource, q.NodeName)
		}
		return "Governor quota spent"
	case admission.CauseWaitTimeout:
		if q := d.WaitedFor; q != nil {
			return fmt.Sprintf("Governor wait timeout: no %d %s within %v", q.Amount, q.Resource, d.Wait)
		}
		return fmt.Sprintf("Governor wait timeout: no %s lease within %v", d.Class, d.Wait)
	case admission.CauseUnavailable, admission.CauseStopping:
		return "Governor unavailable"
	case admission.CauseTaskEnded:
		if e := d.Ended; e != nil {
			return fmt.Sprintf("Governor task ended: %q %s", e.NodeName, admission.StateName(e.State))
		}
		return "Governor task ended"
	case admission.CauseUnmatched:
		return "Governor no rule matches"
	case admission.CauseRate:
		if r := d.Rate; r != nil {
			return fmt.Sprintf("Governor rate: %s on %q", r.Resource, r.NodeName)
		}
		return "Governor rate"
	case admission.CauseSuspended:
		return "Governor tenant suspended"
	case admission.CauseReadOnly:
		return "Governor tenant read-only"
	}
	return "Bad Request"
}

// denialBody is the JSON body of a denial. It is shaped like the error
// bodies of the LLM APIs ({"error": {"message": ...}}), so their clients
// show the message.
type denialBody struct {
	Error denialError `json:"error"`
}

type denialError struct {
	Type            string    `json:"type"` // "governor_denied" exactly when Governor-Denied is sent
	Cause           string    `json:"cause"`
	Message         string    `json:"message"`
	Cap             string    `json:"cap,omitempty"` // the resource whose quota was hit
	Node            string    `json:"node,omitempty"`
	NodeID          int64     `json:"node_id,omitempty"`
	Used            *int64    `json:"used,omitempty"`
	Limit           *int64    `json:"limit,omitempty"`
	Requested       int64     `json:"requested,omitempty"`
	LargestConsumer *consumer `json:"largest_consumer,omitempty"`
	Class           string    `json:"class,omitempty"`
	WaitTimeout     string    `json:"wait_timeout,omitempty"`
	State           string    `json:"state,omitempty"`
	// OutputField and OutputFits: a metered call whose estimate did not
	// fit in what was left, and the largest output limit that would have.
	OutputField string `json:"output_field,omitempty"`
	OutputFits  *int64 `json:"output_fits,omitempty"`
}

type consumer struct {
	Node   string `json:"node"`
	NodeID int64  `json:"node_id"`
	Used   int64  `json:"used"`
}

func (d denial) body() []byte {
	e := denialError{Type: "governor_canceled", Cause: d.wireCause(), Message: d.Message()}
	if d.Governed() {
		e.Type = "governor_denied"
	}
	switch d.Cause {
	case admission.CauseQuota:
		if q := d.Quota; q != nil {
			used, limit := q.Used, q.Limit
			e.Cap, e.Node, e.NodeID, e.Used, e.Limit, e.Requested = q.Resource, q.NodeName, q.NodeID, &used, &limit, q.Amount
			if q.LargestConsumerID != 0 {
				e.LargestConsumer = &consumer{Node: q.LargestConsumerName, NodeID: q.LargestConsumerID, Used: q.LargestConsumerUsed}
			}
		}
		if f := d.Estimate; f != nil && f.MaxOutput() > 0 {
			fits := f.MaxOutput()
			e.OutputField, e.OutputFits = f.Field, &fits
		}
	case admission.CauseWaitTimeout:
		e.Class, e.WaitTimeout = d.Class, d.Wait.String()
		if q := d.WaitedFor; q != nil {
			e.Cap, e.Requested = q.Resource, q.Amount
		}
	case admission.CauseTaskEnded:
		if x := d.Ended; x != nil {
			e.Node, e.NodeID, e.State = x.NodeName, x.NodeID, admission.StateName(x.State)
		}
	}
	b, _ := json.Marshal(denialBody{Error: e})
	return append(b, '\n')
}

// header returns the headers of the denial's response.
func (d denial) header() http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}}
	if !d.Governed() {
		return h
	}
	h.Set(HeaderDenied, d.wireCause())
	w := d.Cause.Wire()
	if w.ShouldRetry != "" {
		h.Set("X-Should-Retry", w.ShouldRetry) // read by the OpenAI and Anthropic SDKs
	}
	switch w.RetryAfter {
	case admission.RetryAfterSoon:
		h.Set("Retry-After", retryAfter)
	case admission.RetryAfterRate:
		h.Set("Retry-After", rateRetryAfter(d.Rate))
	}
	return h
}

// response builds the denial as the response to req. For CONNECT the reason
// goes into the status line and the connection closes after it.
func (d denial) response(req *http.Request) *http.Response {
	return localResponse(req, d.status(), d.reason(), d.header(), d.body())
}

// refusal is a request the proxy will not forward: for its own safety (a
// forbidden target, a missing proxy password), with cause set, or because
// the upstream failed (502, 504), with no cause. A refusal with a cause
// carries it in Governor-Denied and a JSON body like a denial's, so that a
// client can tell it from the upstream's answer; an upstream failure
// carries no Governor-Denied.
type refusal struct {
	code   int
	reason string // the status line's reason phrase for CONNECT
	cause  string // the Governor-Denied value; "" for an upstream failure
	header http.Header
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func (r *refusal) response(req *http.Request) *http.Response {
	h := http.Header{"Content-Type": {"text/plain; charset=utf-8"}, "Cache-Control": {"no-store"}}
	body := []byte("governor-proxy: " + r.err.Error() + "\n")
	if r.cause != "" {
		h.Set("Content-Type", "application/json")
		h.Set(HeaderDenied, r.cause)
		body, _ = json.Marshal(denialBody{Error: denialError{Type: "governor_denied", Cause: r.cause, Message: "governor-proxy: " + r.err.Error()}})
		body = append(body, '\n')
	}
	for k, v := range r.header {
		h[k] = v
	}
	return localResponse(req, r.code, r.reason, h, body)
}

// localResponse is a response the proxy makes itself.
func localResponse(req *http.Request, code int, reason string, h http.Header, body []byte) *http.Response {
	resp := &http.Response{
		StatusCode: code, Status: strconv.Itoa(code) + " " + strings.ReplaceAll(reason, "\n", " "),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Request: req,
	}
	if req != nil && req.Method == http.MethodConnect {
		if req.ProtoMajor == 1 {
			resp.Proto, resp.ProtoMinor = req.Proto, req.ProtoMinor
		}
		resp.Close = true
		resp.Request = nil // Response.Write would drop the body of a response to a HEAD only; keep it plain
	}
	return resp
}

// asResponder finds the proxy's own answer to an error, if it has one.
func asResponder(err error) interface {
	response(*http.Request) *http.Response
} {
	var d *admission.Denial
	if errors.As(err, &d) {
		return denial{d}
	}
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// rateRetryAfter is Retry-After for a refusal for rate: the seconds until
// the rate has room, rounded up, and at least 1.
func rateRetryAfter(r *governor.RateLimitedError) string {
	if r == nil || r.RetryAfter <= time.Second {
		return "1"
	}
	return strconv.FormatInt(int64((r.RetryAfter+time.Second-1)/time.Second), 10)
}
