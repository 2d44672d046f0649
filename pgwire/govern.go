package pgwire

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/classify/sqlclass"
	"github.com/governor-project/governor/proxy/admission"
)

// Governing statements: each statement is matched to its rule on its own;
// a transaction holds one lease of each class its statements' rules name,
// taken at the first statement that needs it and held to the transaction's
// end; and every statement's charges are taken before it is sent, all of a
// message's or none.

// heldTicket is a lease the transaction holds.
type heldTicket struct {
	class string
	t     admission.Ticket
	since time.Time
	write bool // admitted as a write, or since checked as one (checkWrite)
}

// byConnection is the Class of a text the rules in force decide by its
// connection alone (classify.Rules.MatchSQLConnection) without a charge, so
// that it need not be classified at all.
var byConnection = &sqlclass.Class{}

// governs reports whether the proxy governs statements at all. A
// passthrough proxy (no Admitter or no Rules) admits nothing, so it
// classifies nothing.
func (c *conn) governs() bool { return c.p.Admitter != nil && c.p.Rules != nil }

// decidedByConnection reports whether the rules in force decide every
// statement of this connection without looking at it, keeping the answer
// for as long as the rules stay the same.
func (c *conn) decidedByConnection() bool {
	rules := c.p.Rules()
	if rules != c.rulesSeen {
		c.rulesSeen = rules
		c.connRule, c.connMatched, c.connDecides = rules.MatchSQLConnection(c.statement(nil))
	}
	return c.connDecides
}

func (c *conn) statement(s *sqlclass.Statement) classify.SQLStatement {
	st := classify.SQLStatement{Database: c.database, User: c.user, ApplicationName: c.appName}
	if s != nil {
		st.Kinds, st.Tables = s.Kinds, s.Tables
	}
	return st
}

// ask is one admission a message needs, with the rule it is for.
type ask struct {
	req admission.Request
	d   classify.Decision
}

// plan gathers what a message's statements need: the classes the
// transaction does not hold yet, and the sum of their charges.
type plan struct {
	held     []string // the classes held already
	readHeld []string // those held by tickets admitted as reads
	// readRule is a rule of the message whose class is in readHeld: a
	// write needs a check that the tenant takes writes (checkWrite).
	readRule classify.Decision
	classes  []ask
	charges  map[string]int64
	owned    bool // charges is the plan's own (a sum), not a rule's
	chargeBy classify.Decision
	// result is the first rule of the message whose statements' results
	// are charged (result.go).
	result classify.Decision
	// Room for the common case, so that planning allocates nothing.
	heldBuf  [4]string
	classBuf [2]ask
}

func (p *plan) add(d classify.Decision, count int) {
	if d.Result != nil && p.result.Result == nil {
		p.result = d
	}
	if d.Class != "" && p.readRule.Rule == "" && slices.Contains(p.readHeld, d.Class) {
		p.readRule = d
	}
	if d.Class != "" && !slices.Contains(p.held, d.Class) &&
		!slices.ContainsFunc(p.classes, func(a ask) bool { return a.req.Class == d.Class }) {
		p.classes = append(p.classes, ask{req: admission.Request{Class: d.Class}, d: d})
	}
	if len(d.Charges) == 0 || count <= 0 {
		return
	}
	if p.charges == nil && count == 1 {
		p.charges, p.chargeBy = d.Charges, d
		return
	}
	if !p.owned {
		sum := make(map[string]int64, len(d.Charges)+len(p.charges))
		for r, n := range p.charges {
			sum[r] = n
		}
		p.charges, p.owned = sum, true
	}
	if p.chargeBy.Rule == "" {
		p.chargeBy = d
	}
	for r, n := range d.Charges {
		p.charges[r] += n * int64(count)
	}
}

// asks are the admissions in the order they are asked: the classes sorted
// (two messages that need the same classes take them in the same order),
// the charges with the last, so that a charge is taken only once every
// slot is.
func (p *plan) asks() []ask {
	slices.SortFunc(p.classes, func(a, b ask) int { return strings.Compare(a.req.Class, b.req.Class) })
	asks := p.classes
	switch {
	case p.charges == nil:
	case len(asks) == 0:
		asks = append(asks, ask{req: admission.Request{Charges: p.charges, DenyRate: p.chargeBy.DenyRate}, d: p.chargeBy})
	default:
		asks[len(asks)-1].req.Charges, asks[len(asks)-1].req.DenyRate = p.charges, p.chargeBy.DenyRate
	}
	if r := p.result.Result; r != nil {
		// First: what it holds is given back whole if a later ask is
		// refused (obtain), where a charge taken could not be.
		asks = slices.Insert(asks, 0, ask{req: admission.Request{Charges: resultHold(r), Held: true}, d: p.result})
	}
	return asks
}

// admit asks the Admitter about the statements of a message about to be
// sent (the machine's ask). Its verdict holds the leases granted, appended
// to grants, to forward the message; or the ErrorResponse of the denial,
// and then nothing was charged and no lease it took is kept. It reports
// false, and asks nothing, when it needs to know whether a message
// decided by its connection alone writes: the machine classifies it first.
func (c *conn) admit(q admitReq, grants []heldTicket) (verdict, bool) {
	p := &c.planBuf // the client goroutine's own: a plan on the stack would escape
	*p = plan{}
	c.plan(p, q)
	asks := p.asks()
	v := verdict{grants: grants}
	if len(asks) == 0 && p.readRule.Rule == "" {
		return v, true
	}
	if !q.classified {
		return v, false
	}
	write := c.writes(q.run)
	if len(asks) == 0 {
		if write { // nothing to admit, but the lease held was taken for reads
			v.deny, v.wrote = c.checkWrite(p.readRule)
		}
		return v, true
	}
	if write {
		for i := range asks {
			asks[i].req.Write = true
		}
	}
	var badSubtask error
	if c.p.TaskFromApplicationName {
		if badSubtask = checkSubtask(c.appName); badSubtask == nil {
			for i := range asks { // shadow ones too: dry runs are for the subtask
				asks[i].req.Subtask = c.appName
			}
		}
	}
	if asks = c.shadow(asks); len(asks) == 0 {
		return v, true // rules in dry run only: the statements run unadmitted
	}
	if badSubtask != nil {
		a := asks[0]
		v.deny = c.deny(a.d, a.req, &admission.Denial{Cause: admission.CauseBadRequest, Class: a.req.Class, Err: badSubtask}, 0)
		return v, true
	}
	return c.obtain(asks, v, q.noticeDue), true
}

// plan fills p with what q's statements need, given the leases the
// transaction holds.
func (c *conn) plan(p *plan, q admitReq) {
	p.held = p.heldBuf[:0]
	c.mu.Lock()
	for _, h := range c.m.tickets {
		p.held = append(p.held, h.class)
		if !h.write {
			p.readHeld = append(p.readHeld, h.class)
		}
	}
	c.mu.Unlock()
	p.classes = p.classBuf[:0]
	if q.cl == byConnection {
		if c.connMatched {
			p.add(c.connRule, 1)
		}
		return
	}
	rules := c.p.Rules()
	for i := range q.run {
		if d, ok := rules.MatchSQL(c.statement(&q.run[i])); ok {
			p.add(d, q.run[i].Count)
		}
	}
}

// obtain admits asks, all or none, and appends the leases to v's grants;
// the transaction gets its NOTICE of a cap when noticeDue.
func (c *conn) obtain(asks []ask, v verdict, noticeDue bool) verdict {
	var w waiter
	defer w.done()
	var grantBuf [2]granted
	gs := grantBuf[:0]
	for _, a := range asks {
		t, waited, den := c.admitOne(&w, a)
		if den != nil {
			for _, g := range gs {
				if s, ok := g.t.(admission.Settler); ok && g.req.Held {
					s.Settle(map[string]int64{}) // nothing was used: what it held goes back
				}
				if g.t != nil {
					g.t.End(0, false) // the message never ran
				}
			}
			v.deny = den
			return v
		}
		gs = append(gs, granted{a, t, waited})
	}
	now := time.Now()
	for _, g := range gs {
		if s, ok := g.t.(admission.Settler); ok && g.req.Held {
			v.result = &resultCharge{rule: g.d.Rule, res: g.d.Result, subtask: g.req.Subtask, t: s}
			continue
		}
		if g.t != nil {
			v.grants = append(v.grants, heldTicket{class: g.req.Class, t: g.t, since: now, write: g.req.Write})
		}
	}
	for _, g := range gs {
		c.admitted(g.d, g.req, g.waited)
	}
	if noticeDue {
		v.noticed = c.noticeCaps(asks[0].req.Subtask)
	}
	return v
}

// checkWrite asks whether a write may go on in the transaction whose
// lease of d's class was taken for reads (BEGIN; SELECT; UPDATE): a
// read_only tenant refuses it, as it would have refused the lease for it.
// Once it may, the transaction's leases count as taken for writes (wrote).
func (c *conn) checkWrite(d classify.Decision) (deny []byte, wrote bool) {
	wc := c.p.WriteCheck
	if wc == nil {
		return nil, false
	}
	req := admission.Request{Class: d.Class, Write: true}
	if c.p.TaskFromApplicationName && checkSubtask(c.appName) == nil {
		req.Subtask = c.appName
	}
	ctx, cancel := context.WithTimeout(c.ctx, askTimeout)
	err := wc.CheckWrite(ctx, req)
	cancel()
	if err != nil {
		return c.deny(d, req, admission.Deny(ctx, err, d.Class, 0), 0), false
	}
	return nil, true
}

// granted is an ask that was admitted.
type granted struct {
	ask
	t      admission.Ticket
	waited time.Duration
}

// waiter is the one wait a message's admissions share: wait_timeout bounds
// them together.
type waiter struct {
	ctx  context.Context
	stop func()
}

func (w *waiter) done() {
	if w.stop != nil {
		w.stop()
	}
}

// admitOne admits one ask, at once when the Admitter can, else waiting.
func (c *conn) admitOne(w *waiter, a ask) (admission.Ticket, time.Duration, []byte) {
	if f, ok := c.p.Admitter.(admission.Fast); ok {
		if t, ok := f.TryAdmit(a.req); ok {
			return t, 0, nil
		}
	}
	// What was already forwarded must not wait behind our wait.
	if err := c.sw.Flush(); err != nil {
		return nil, 0, errorResponse("ERROR", SQLStateUnavailable, "governor-proxy: the connection is failing")
	}
	wait := c.p.waitTimeout()
	if w.ctx == nil {
		w.ctx, w.stop = admission.WithWaitTimeout(c.ctx, wait)
	}
	notice := time.AfterFunc(WaitNoticeAfter, func() {
		c.writeClient(noticeResponse(fmt.Sprintf("governor: waiting for a %q lease (rule %q)", a.req.Class, a.d.Rule)), true)
	})
	defer notice.Stop()
	began := time.Now()
	t, err := c.p.Admitter.Admit(w.ctx, a.req)
	waited := time.Since(began)
	if err != nil {
		return nil, waited, c.deny(a.d, a.req, admission.Deny(w.ctx, err, a.req.Class, wait), waited)
	}
	return t, waited, nil
}

// admitted counts an admitted ask, and logs it at debug level: a database
// client may run thousands of transactions a second.
func (c *conn) admitted(d classify.Decision, req admission.Request, waited time.Duration) {
	c.p.Metrics.admitted(&c.series, d.Rule, req.Class, waited)
	if c.p.Logger != nil && c.p.Logger.Enabled(context.Background(), slog.LevelDebug) {
		c.p.Logger.LogAttrs(context.Background(), slog.LevelDebug, "decision",
			slog.String("kind", "pgwire"), slog.String("rule", d.Rule), slog.String("class", req.Class),
			slog.String("subtask", req.Subtask), slog.String("outcome", "admitted"), slog.Duration("wait", waited),
			slog.String("database", c.database))
	}
}

// deny counts and logs a refused statement, and returns the ERROR the
// client gets.
func (c *conn) deny(d classify.Decision, req admission.Request, den *admission.Denial, waited time.Duration) []byte {
	code, f := sqlState(den)
	c.p.count(f)
	c.p.Metrics.denied(d.Rule, req.Class, den.Cause, waited)
	if c.p.Logger != nil {
		c.p.Logger.LogAttrs(context.Background(), slog.LevelInfo, "decision",
			slog.String("kind", "pgwire"), slog.String("rule", d.Rule), slog.String("class", d.Class),
			slog.String("subtask", req.Subtask), slog.String("outcome", "denied"), slog.String("cause", den.Cause.String()),
			slog.String("sqlstate", code), slog.Duration("wait", waited), slog.String("database", c.database),
			slog.String("err", den.Error()))
	}
	return errorResponse("ERROR", code, den.Message())
}

// checkSubtask applies the rule of a subtask's name, the same as for a
// Proxy-Authorization username, to an application_name that names one.
func checkSubtask(name string) error {
	if err := admission.CheckSubtaskName(name); err != nil {
		return fmt.Errorf("application_name names the subtask and %w", err)
	}
	return nil
}
