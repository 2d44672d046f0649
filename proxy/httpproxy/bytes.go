package httpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// Bytes on the wire (a rule's bytes: key). A body whose length is known
// (Content-Length) is charged whole before it is forwarded: the request's
// with the rule's admission, all or none, the response's before its
// headers reach the client, so that a quota too small for it refuses it
// (429 quota) and nothing of it passes. A body of unknown length, one whose
// whole charge a rate cannot take at once, and a tunnel's bytes are
// charged as they stream, a chunk ahead of what passes, through the same
// admission and its pacing: a rate slows the copy rather than refusing it.
// When a chunk is refused (a quota spent, governord unreachable, the task
// ended) the transfer stops where its charges end: one log line, and
// governor_proxy_bytes_cut_total.

// Directions, the "direction" label of governor_proxy_bytes_total.
const (
	dirRequest  = "request"  // a request body; a tunnel's bytes from the client
	dirResponse = "response" // a response body; a tunnel's bytes to the client
)

// rateChunkShare is the most of a second's worth of a rate one chunk
// takes, so that a shaped copy moves in steps of at most a tenth of a
// second.
const rateChunkShare = 10

// rateChunkOfBurst is the most of a rate's burst one chunk takes. While
// sidecars hold slices of the rate, its bucket at governord holds its
// burst less what they carved (half of it for the first slice, half of
// the rest for the next) and each slice's own bucket holds what it
// carved: a chunk of a quarter of the burst fits in both while up to two
// slices live, rather than waiting for them to end.
const rateChunkOfBurst = 4

// byteMeter charges the bytes of one direction of one exchange.
type byteMeter struct {
	p         *Proxy
	ex        *exchange
	ctx       context.Context // the transfer's: the client's request, or the tunnel's life
	direction string
	chunk     int64 // the most one charge takes now
	rateKnown bool  // a refusal for rate has sized the chunk: charges wait for the rate
	credit    int64 // bytes charged that have not passed yet
	left      int64 // bytes still to come when the length is known; -1 when not
	passed    int64
	cut       *admission.Denial // why the transfer stopped; nil while it goes on
}

func (p *Proxy) newByteMeter(ctx context.Context, ex *exchange, direction string, length int64) *byteMeter {
	return &byteMeter{p: p, ex: ex, ctx: ctx, direction: direction, chunk: ex.decision.Bytes.Chunk, left: length}
}

// take charges what n more bytes need beyond the credit, and returns how
// many of them may pass: n, or fewer with the denial that cut the
// transfer.
func (m *byteMeter) take(n int) (int, error) {
	if m.cut != nil {
		return 0, m.cut
	}
	for m.credit < int64(n) {
		need := int64(n) - m.credit
		amount := m.chunk
		if m.left >= 0 && m.left < amount {
			amount = max(m.left, min(need, amount)) // no more than the body declared, unless it runs over
		}
		got, den := m.charge(amount)
		m.credit += got
		if m.left >= 0 {
			m.left = max(0, m.left-got)
		}
		if den != nil {
			ok := min(int64(n), m.credit)
			m.credit -= ok
			m.passed += ok
			m.cutOff(den)
			return int(ok), m.cut
		}
	}
	m.credit -= int64(n)
	m.passed += int64(n)
	return n, nil
}

// charge charges amount bytes, or less, and says how many it charged. A
// chunk a rate's bucket can never hold is halved until it can; a refusal
// for rate sizes the chunk to the rate and then waits for it, as long as
// the transfer lasts; a quota with less room than the chunk is charged
// what room it has.
func (m *byteMeter) charge(amount int64) (int64, *admission.Denial) {
	res := m.ex.decision.Bytes.Resource
	triedRoom := false
	for {
		req := admission.Request{Subtask: m.ex.subtask, Charges: map[string]int64{res: amount}, DenyRate: !m.rateKnown}
		t, err := m.p.admitNow(m.ctx, req)
		if err == nil {
			if t != nil {
				t.End(0, false)
			}
			m.p.m.bytes.WithLabelValues(m.ex.rule, res, m.direction).Add(float64(amount))
			return amount, nil
		}
		den := admission.Deny(m.ctx, err, "", 0)
		switch {
		case den.Cause == admission.CauseRate && den.Rate != nil && !m.rateKnown:
			m.rateKnown = true
			m.chunk = rateChunk(m.chunk, den.Rate)
			amount = min(amount, m.chunk)
			continue
		case neverFits(den) && amount > 1:
			m.chunk = max(1, amount/2)
			amount = m.chunk
			continue
		case den.Cause == admission.CauseQuota && den.Quota != nil && !triedRoom:
			if room := den.Quota.Limit - den.Quota.Used; room > 0 && room < amount {
				amount, triedRoom = room, true
				continue
			}
		}
		return 0, den
	}
}

// admitNow admits a charge, from what the sidecar holds when it can.
func (p *Proxy) admitNow(ctx context.Context, req admission.Request) (admission.Ticket, error) {
	if f, ok := p.Admitter.(admission.Fast); ok {
		if t, ok := f.TryAdmit(req); ok {
			return t, nil
		}
	}
	return p.Admitter.Admit(ctx, req)
}

// rateChunk is the chunk a rate allows: no more than a quarter of what
// its bucket holds (rateChunkOfBurst) nor a tenth of a second of it, and
// at least 1.
func rateChunk(chunk int64, r *governor.RateLimitedError) int64 {
	burst := r.Burst
	if burst <= 0 {
		burst = r.Units
	}
	if burst > 0 {
		chunk = min(chunk, max(1, burst/rateChunkOfBurst))
	}
	if r.Units > 0 && r.Per > 0 {
		perStep := float64(r.Units) * float64(time.Second/rateChunkShare) / float64(r.Per)
		if perStep < float64(chunk) {
			chunk = int64(perStep)
		}
	}
	return max(1, chunk)
}

// neverFits says whether governord refused a charge as one no rate's
// bucket can ever hold (its burst is smaller).
func neverFits(d *admission.Denial) bool {
	return d.Cause == admission.CauseBadRequest && errors.Is(d, governor.ErrInvalidArgument)
}

// cutOff notes why the transfer stops, and says so once: a log line and a
// count, unless the client went away, which is not the proxy's doing.
func (m *byteMeter) cutOff(den *admission.Denial) {
	m.cut = den
	if !den.Governed() {
		return
	}
	res := m.ex.decision.Bytes.Resource
	m.p.m.bytesCut.WithLabelValues(m.ex.rule, res, den.Cause.String()).Inc()
	attrs := []slog.Attr{slog.String("kind", m.ex.kind), slog.String("rule", m.ex.rule), slog.String("subtask", m.ex.subtask),
		slog.String("resource", res), slog.String("direction", m.direction), slog.Int64("sent", m.passed),
		slog.String("cause", den.Cause.String())}
	if q := den.Quota; q != nil {
		attrs = append(attrs, slog.Int64("used", q.Used), slog.Int64("limit", q.Limit), slog.String("node", q.NodeName))
	}
	attrs = append(attrs, slog.String("err", den.Error()))
	m.p.log.LogAttrs(context.Background(), slog.LevelWarn, "governor-proxy: a transfer was cut: its bytes could not be charged", attrs...)
}

// errBytesCut marks the error a cut body returns, so that the response's
// copy is aborted rather than ended as if complete.
type errBytesCut struct{ den *admission.Denial }

func (e *errBytesCut) Error() string {
	return "governor-proxy: the transfer was cut: " + e.den.Error()
}

func (e *errBytesCut) Unwrap() error { return e.den }

// bytesBody is a body whose bytes are charged as they are read. Each read
// asks for no more than a chunk, so that a shaped copy moves in steps.
type bytesBody struct {
	rc io.ReadCloser
	m  *byteMeter
}

func (b *bytesBody) Read(p []byte) (int, error) {
	if b.m.cut != nil {
		return 0, &errBytesCut{b.m.cut}
	}
	if int64(len(p)) > b.m.chunk {
		p = p[:b.m.chunk]
	}
	n, err := b.rc.Read(p)
	if n > 0 {
		ok, cerr := b.m.take(n)
		if cerr != nil {
			b.rc.Close()
			if ok > 0 {
				return ok, nil // what was charged passes; the next read says why no more does
			}
			return 0, &errBytesCut{b.m.cut}
		}
	}
	return n, err
}

func (b *bytesBody) Close() error { return b.rc.Close() }

// requestBytes prepares an admitted request's body under a bytes rule
// that counts requests: a known length is charged with the admission
// (upfront, by admit), any other body as it streams.
func (p *Proxy) requestBytes(r *http.Request, ex *exchange) {
	if ex.upfront > 0 {
		p.m.bytes.WithLabelValues(ex.rule, ex.decision.Bytes.Resource, dirRequest).Add(float64(ex.upfront))
		return
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return
	}
	ex.reqBytes = p.newByteMeter(r.Context(), ex, dirRequest, r.ContentLength)
	r.Body = &bytesBody{rc: r.Body, m: ex.reqBytes}
}

// upfrontBytes is the charge of a request body of known length, taken with
// the rule's admission: 0 when there is none to take. A length over what
// one charge may be is refused.
func upfrontBytes(r *http.Request, d classify.Decision) (int64, error) {
	if d.Bytes == nil || !d.Bytes.Request || r.ContentLength <= 0 {
		return 0, nil
	}
	if r.ContentLength > governor.MaxAmount {
		return 0, &admission.Denial{Cause: admission.CauseBadRequest,
			Err: fmt.Errorf("Content-Length %d is over %d, the most the sidecar can charge to %s", r.ContentLength, governor.MaxAmount, d.Bytes.Resource)}
	}
	return r.ContentLength, nil
}

// withBytes is charges with n more of resource.
func withBytes(charges map[string]int64, resource string, n int64) map[string]int64 {
	out := make(map[string]int64, len(charges)+1)
	for r, v := range charges {
		out[r] = v
	}
	out[resource] += n
	return out
}

// chargedAsItStreams says whether a refusal of a body's whole charge
// leaves it to be charged as it streams instead: a rate had no room for it
// (or no bucket could ever hold it), which a copy paced chunk by chunk
// honours; a quota is refused whole.
func chargedAsItStreams(d *admission.Denial, resource string) bool {
	return (d.Cause == admission.CauseRate && (d.Rate == nil || d.Rate.Resource == resource)) || neverFits(d)
}

// responseBytes charges an admitted response's body under a bytes rule
// that counts responses: a known length whole, before the headers are
// sent on, any other as it streams. A non-nil result is the denial to
// answer with instead; the upstream's response is then closed.
func (p *Proxy) responseBytes(req *http.Request, ex *exchange, resp *http.Response) *admission.Denial {
	res := ex.decision.Bytes.Resource
	if n := resp.ContentLength; n > 0 && n <= governor.MaxAmount {
		wctx, cancel := admission.WithWaitTimeout(req.Context(), p.waitTimeout())
		defer cancel()
		t, err := p.admitNow(wctx, admission.Request{Subtask: ex.subtask, Charges: map[string]int64{res: n}})
		if err == nil {
			if t != nil {
				t.End(0, false)
			}
			p.m.bytes.WithLabelValues(ex.rule, res, dirResponse).Add(float64(n))
			return nil
		}
		if den := admission.Deny(wctx, err, "", p.waitTimeout()); !chargedAsItStreams(den, res) {
			resp.Body.Close()
			return den
		}
	}
	if resp.ContentLength == 0 {
		return nil
	}
	ex.respBytes = p.newByteMeter(req.Context(), ex, dirResponse, resp.ContentLength)
	resp.Body = &bytesBody{rc: resp.Body, m: ex.respBytes}
	return nil
}

// cutDenial is the denial that cut the request's body, if one did.
func (ex *exchange) cutDenial() *admission.Denial {
	if ex.reqBytes != nil && ex.reqBytes.cut != nil && ex.reqBytes.cut.Governed() {
		return ex.reqBytes.cut
	}
	return nil
}

// tunnelBytes sets up the charging of a tunnel's bytes under a bytes
// rule: what the upstream sends as the response direction, what the client
// sends as the request direction. The charges wait as long as the tunnel
// lasts; closing it ends them.
func (p *Proxy) tunnelBytes(t *tunnelConn) {
	b := t.ex.decision.Bytes
	if b == nil || t.ex.shadowed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.stopBytes = cancel
	if b.Response {
		t.down = p.newByteMeter(ctx, t.ex, dirResponse, -1)
	}
	if b.Request {
		t.up = p.newByteMeter(ctx, t.ex, dirRequest, -1)
	}
}

// readMetered reads the upstream's bytes, a chunk at a time, each charged
// before it goes on to the client; a cut closes the tunnel.
func (t *tunnelConn) readMetered(b []byte) (int, error) {
	if t.down.cut != nil {
		t.Close()
		return 0, &errBytesCut{t.down.cut}
	}
	if int64(len(b)) > t.down.chunk {
		b = b[:t.down.chunk]
	}
	n, err := t.Conn.Read(b)
	if n > 0 {
		t.touch()
		ok, cerr := t.down.take(n)
		if cerr != nil {
			if ok == 0 {
				t.Close()
				return 0, cerr
			}
			return ok, nil
		}
	}
	return n, err
}

// writeMetered sends the client's bytes upstream, a chunk at a time, each
// charged before it is written; a cut closes the tunnel.
func (t *tunnelConn) writeMetered(b []byte) (int, error) {
	written := 0
	for written < len(b) {
		piece := b[written:]
		if int64(len(piece)) > t.up.chunk {
			piece = piece[:t.up.chunk]
		}
		ok, cerr := t.up.take(len(piece))
		n, err := t.Conn.Write(piece[:ok])
		written += n
		if n > 0 {
			t.touch()
		}
		if cerr != nil {
			t.Close()
			return written, cerr
		}
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// bytesDenied is the answer to a request a bytes rule refused after it
// was admitted: its response's length did not fit, or its body was cut.
func (p *Proxy) bytesDenied(req *http.Request, ex *exchange, den *admission.Denial) *http.Response {
	ex.local = true
	p.deny(ex, classify.HTTPRequestFrom(req), den, 0)
	return localFor(req, denial{den}.response(req))
}
