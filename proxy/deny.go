package proxy

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

	"github.com/governor-project/governor/api/governorpb"
)

// HeaderDenied is the header that marks a response as the proxy's denial.
// Only the proxy sets it: it is removed from every upstream response.
const HeaderDenied = "Governor-Denied"

// Causes of a denial: the values of Governor-Denied (DESIGN.md's table) and
// of the "cause" metrics label.
const (
	causeQuota       = "quota"        // 429: a quota on the node or an ancestor is spent
	causeWaitTimeout = "wait-timeout" // 503: no lease within http.wait_timeout
	causeUnavailable = "unavailable"  // 503: governord unreachable, or no session (fail closed)
	causeTaskEnded   = "task-ended"   // 403: the task or subtask ended or passed its deadline
	causeUnmatched   = "unmatched"    // 403: no rule matched and http.unmatched is deny
	// Not denials by governord; no Governor-Denied header is sent for them.
	causeCanceled   = "canceled"    // the client went away while it waited
	causeBadRequest = "bad-request" // 400: a malformed Proxy-Authorization or too many subtasks
)

// retryAfter is the Retry-After sent with 503 denials: soon, since the
// client will queue again anyway.
const retryAfter = "1"

// denial is an admission that did not happen.
type denial struct {
	cause string
	class string
	quota *governorpb.Denial    // for causeQuota, when governord sent the detail
	ended *governorpb.NodeEnded // for causeTaskEnded, when governord sent the detail
	wait  time.Duration         // for causeWaitTimeout: the wait_timeout
	err   error
}

func (d *denial) Error() string {
	if d.err != nil {
		return d.cause + ": " + d.err.Error()
	}
	return d.cause
}

func (d *denial) Unwrap() error { return d.err }

func (d *denial) status() int {
	switch d.cause {
	case causeQuota:
		return http.StatusTooManyRequests
	case causeWaitTimeout, causeUnavailable, causeCanceled:
		return http.StatusServiceUnavailable
	case causeTaskEnded, causeUnmatched:
		return http.StatusForbidden
	}
	return http.StatusBadRequest
}

// reason is the reason phrase of a CONNECT denial's status line, which is
// all most clients show of a failed tunnel, e.g.
//
//	Governor quota spent: llm_calls on "pod-7"
func (d *denial) reason() string {
	switch d.cause {
	case causeQuota:
		if q := d.quota; q != nil {
			return fmt.Sprintf("Governor quota spent: %s on %q", q.GetResource(), q.GetNodeName())
		}
		return "Governor quota spent"
	case causeWaitTimeout:
		return fmt.Sprintf("Governor wait timeout: no %s lease within %v", d.class, d.wait)
	case causeUnavailable:
		return "Governor unavailable"
	case causeTaskEnded:
		if e := d.ended; e != nil {
			return fmt.Sprintf("Governor task ended: %q %s", e.GetNodeName(), stateName(e.GetState()))
		}
		return "Governor task ended"
	case causeUnmatched:
		return "Governor no rule matches"
	}
	return "Bad Request"
}

// message is the human-readable sentence of the JSON body.
func (d *denial) message() string {
	switch d.cause {
	case causeQuota:
		q := d.quota
		if q == nil {
			return "governor: quota spent"
		}
		s := fmt.Sprintf("governor: quota spent: %s on %q is %d of %d, this request asked %d more",
			q.GetResource(), q.GetNodeName(), q.GetUsed(), q.GetLimit(), q.GetAmount())
		if q.GetLargestConsumerId() != 0 {
			s += fmt.Sprintf("; the largest consumer is %q with %d", q.GetLargestConsumerName(), q.GetLargestConsumerUsed())
		}
		return s
	case causeWaitTimeout:
		return fmt.Sprintf("governor: waited %v for a %s lease; the limit stayed full", d.wait, d.class)
	case causeUnavailable:
		return "governor: governord cannot be reached, so no new work is admitted (fail closed)"
	case causeTaskEnded:
		if e := d.ended; e != nil {
			return fmt.Sprintf("governor: the task %q has ended (%s); it admits no more work", e.GetNodeName(), stateName(e.GetState()))
		}
		return "governor: the task has ended; it admits no more work"
	case causeUnmatched:
		return "governor: no rule matches this request and http.unmatched is deny"
	}
	if d.err != nil {
		return "governor-proxy: " + d.err.Error()
	}
	return "governor-proxy: bad request"
}

func stateName(s governorpb.NodeState) string {
	switch s {
	case governorpb.NodeState_NODE_STATE_CLOSED:
		return "closed"
	case governorpb.NodeState_NODE_STATE_CANCELLED:
		return "cancelled"
	case governorpb.NodeState_NODE_STATE_EXPIRED:
		return "past its deadline"
	}
	return "ended"
}

// denialBody is the JSON body of a denial. It is shaped like the error
// bodies of the LLM APIs ({"error": {"message": ...}}), so their clients
// show the message.
type denialBody struct {
	Error denialError `json:"error"`
}

type denialError struct {
	Type            string    `json:"type"` // see denial.errorType
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
}

type consumer struct {
	Node   string `json:"node"`
	NodeID int64  `json:"node_id"`
	Used   int64  `json:"used"`
}

func (d *denial) body() []byte {
	e := denialError{Type: d.errorType(), Cause: d.cause, Message: d.message()}
	switch d.cause {
	case causeQuota:
		if q := d.quota; q != nil {
			used, limit := q.GetUsed(), q.GetLimit()
			e.Cap, e.Node, e.NodeID, e.Used, e.Limit, e.Requested = q.GetResource(), q.GetNodeName(), q.GetNodeId(), &used, &limit, q.GetAmount()
			if q.GetLargestConsumerId() != 0 {
				e.LargestConsumer = &consumer{Node: q.GetLargestConsumerName(), NodeID: q.GetLargestConsumerId(), Used: q.GetLargestConsumerUsed()}
			}
		}
	case causeWaitTimeout:
		e.Class, e.WaitTimeout = d.class, d.wait.String()
	case causeTaskEnded:
		if x := d.ended; x != nil {
			e.Node, e.NodeID, e.State = x.GetNodeName(), x.GetNodeId(), stateName(x.GetState())
		}
	}
	b, _ := json.Marshal(denialBody{Error: e})
	return append(b, '\n')
}

// denied reports whether the answer is a denial by governance, which
// carries Governor-Denied; a bad request or a client that went away does
// not.
func (d *denial) denied() bool {
	switch d.cause {
	case causeQuota, causeTaskEnded, causeWaitTimeout, causeUnavailable, causeUnmatched:
		return true
	}
	return false
}

// errorType is the "type" of the JSON body: "governor_denied" exactly when
// the response carries Governor-Denied, so that a client that keys on
// either sees the same thing.
func (d *denial) errorType() string {
	switch {
	case d.denied():
		return "governor_denied"
	case d.cause == causeCanceled:
		return "governor_canceled"
	}
	return "governor_bad_request"
}

// header returns the headers of the denial's response.
func (d *denial) header() http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}}
	if !d.denied() {
		return h
	}
	h.Set(HeaderDenied, d.cause)
	switch d.cause {
	case causeQuota, causeTaskEnded:
		h.Set("X-Should-Retry", "false") // read by the OpenAI and Anthropic SDKs
	case causeWaitTimeout, causeUnavailable:
		h.Set("Retry-After", retryAfter)
	}
	return h
}

// response builds the denial as the response to req. For CONNECT the reason
// goes into the status line and the connection closes after it.
func (d *denial) response(req *http.Request) *http.Response {
	return localResponse(req, d.status(), d.reason(), d.header(), d.body())
}

// refusal is a request the proxy will not forward for its own safety (a
// link-local or metadata address, the proxy itself) or because the upstream
// failed. It is not a governance decision: no Governor-Denied header.
type refusal struct {
	code   int
	reason string // the status line's reason phrase for CONNECT
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func (r *refusal) response(req *http.Request) *http.Response {
	h := http.Header{"Content-Type": {"text/plain; charset=utf-8"}, "Cache-Control": {"no-store"}}
	return localResponse(req, r.code, r.reason, h, []byte("governor-proxy: "+r.err.Error()+"\n"))
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
	var d *denial
	if errors.As(err, &d) {
		return d
	}
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	return nil
}
