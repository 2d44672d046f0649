package governor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Transport returns an http.RoundTripper that governs every request by the
// task in the request's context. Before a request is sent it charges one
// unit of the "http" quota and takes an "http" lease, in one step, waiting
// while the "http" limit is full. The lease is held until the response body
// is read to the end or closed, or the request fails; so, as with any
// http.Client, close every response body.
//
// The release reports the time to the response headers as the latency, and
// reports the downstream as overloaded on 429, 503 or 529, or when the
// response carries Retry-After. A request whose context carries no task
// fails with ErrNoTask; a denied one fails with the governor's error (for a
// spent quota, a *Denial). The response is passed on unchanged apart from its
// Body: Content-Length stays, and streamed bodies keep streaming.
//
// A nil base means http.DefaultTransport.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base}
}

type transport struct {
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	task := TaskFromContext(req.Context())
	if task == nil {
		closeBody(req)
		return nil, fmt.Errorf("governor: %s %s: %w", req.Method, req.URL.Redacted(), ErrNoTask)
	}
	lease, err := task.ChargeAndAcquire(req.Context(), ClassHTTP, map[string]int64{ResourceHTTP: 1})
	if err != nil {
		closeBody(req)
		return nil, err
	}
	start := time.Now()
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		// The base transport closed the request body.
		rerr := release(req.Context(), lease, time.Since(start), false)
		return nil, errors.Join(err, rerr)
	}
	latency := time.Since(start)
	overloaded := Overloaded(resp)
	body := &leaseBody{ReadCloser: resp.Body, release: func() error {
		return release(req.Context(), lease, latency, overloaded)
	}}
	if w, ok := resp.Body.(io.Writer); ok {
		// A 101 Switching Protocols body is also the way to write.
		resp.Body = &leaseRWBody{leaseBody: body, w: w}
	} else {
		resp.Body = body
	}
	return resp, nil
}

// release returns the lease even when the request's context has ended, but
// not for longer than cleanupTimeout.
func release(ctx context.Context, lease *Lease, latency time.Duration, overloaded bool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return lease.Release(ctx, latency, overloaded)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// leaseBody releases the lease once the body is read to its end, fails, or
// is closed, whichever comes first. Reads pass straight through.
type leaseBody struct {
	io.ReadCloser
	release func() error
	once    sync.Once
	err     error
}

func (b *leaseBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done()
	}
	return n, err
}

// Close closes the body and releases the lease; a failed release (say, the
// lease expired while the body streamed) is returned with the close error.
func (b *leaseBody) Close() error {
	err := b.ReadCloser.Close()
	return errors.Join(err, b.done())
}

func (b *leaseBody) done() error {
	b.once.Do(func() { b.err = b.release() })
	return b.err
}

type leaseRWBody struct {
	*leaseBody
	w io.Writer
}

func (b *leaseRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }

// Overloaded reports whether a response says its server is overloaded: 429,
// 503, 529 ("site is overloaded", sent by some APIs) or any Retry-After. A
// release reports it so adaptive limits back off.
func Overloaded(resp *http.Response) bool {
	return resp.StatusCode == http.StatusTooManyRequests ||
		resp.StatusCode == http.StatusServiceUnavailable ||
		resp.StatusCode == 529 ||
		resp.Header.Get("Retry-After") != ""
}
