package pgwire

import (
	"context"
	"log/slog"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/proxy/admission"
)

// What statements return (a rule's result:). A message (a Query, or the
// Executes of a batch up to Sync) whose statements match a rule with
// result: holds one unit of each resource it names before it is sent, with
// its other admissions, all or none: while a quota of them has no room
// left, the statement is refused like any other (53400) and never reaches
// the server. Its DataRow messages are then counted as the server sends
// them (their rows, and the bytes of their bodies) and charged as work
// already done, a chunk at a time, as far as the caps allow; at the
// ReadyForQuery that answers the message the rest is charged and the held
// unit settled, before the ReadyForQuery reaches the client. A result that
// crosses its quota therefore finishes (the server and the client agree
// on everything: the proxy neither drops rows nor invents an error), the
// quota ends exactly full, and the next statement of the rule is refused.
// The rows of a message that ran statements of several result rules are
// charged to the first of them.

// Chunks of a result charged while it streams: one call to governord per
// this many rows or bytes, whichever comes first.
const (
	resultChunkRows  = 1000
	resultChunkBytes = 64 << 10
)

// resultCharge is the charging of what one message's statements return.
type resultCharge struct {
	rule    string
	res     *classify.Result
	subtask string
	t       admission.Settler // holds 1 of each resource the rule names

	rows, bytes               int64 // counted
	chargedRows, chargedBytes int64 // charged beyond the held unit
	held                      bool  // t is settled: the held units are spent or given back
	settled                   bool  // the message was answered: all is charged
}

// resultHold is what a result rule holds before its statement is sent.
func resultHold(r *classify.Result) map[string]int64 {
	h := make(map[string]int64, 2)
	if r.Rows != "" {
		h[r.Rows] = 1
	}
	if r.Bytes != "" {
		h[r.Bytes] = 1
	}
	return h
}

// counted notes one DataRow of n bytes, and says whether a chunk is due.
func (rc *resultCharge) counted(n int) bool {
	rc.rows++
	rc.bytes += int64(n)
	return rc.rows-rc.chargedRows > resultChunkRows || rc.bytes-rc.chargedBytes > resultChunkBytes
}

// due is what the counted rows and bytes still owe beyond the held unit.
func (rc *resultCharge) due() map[string]int64 {
	owed := map[string]int64{}
	if rc.res.Rows != "" {
		if n := max(0, rc.rows-1) - rc.chargedRows; n > 0 {
			owed[rc.res.Rows] = n
		}
	}
	if rc.res.Bytes != "" {
		if n := max(0, rc.bytes-1) - rc.chargedBytes; n > 0 {
			owed[rc.res.Bytes] = n
		}
	}
	return owed
}

// chargeResult charges what rc owes now, as far as the caps allow: what
// a quota has no room for is not charged, and not asked again (the rows
// have gone), and the next statement's hold is refused.
func (c *conn) chargeResult(rc *resultCharge) {
	owed := rc.due()
	if len(owed) == 0 {
		return
	}
	// The held unit is settled first: while held, it stands in the way of
	// the room the quota reports.
	c.settleHold(rc)
	for _, res := range []string{rc.res.Rows, rc.res.Bytes} {
		if n := owed[res]; n > 0 {
			c.chargeUpTo(rc, res, n)
		}
	}
	rc.chargedRows, rc.chargedBytes = max(0, rc.rows-1), max(0, rc.bytes-1)
	if c.p.Metrics != nil {
		c.p.Metrics.result(rc.rule, owed[rc.res.Rows], owed[rc.res.Bytes])
	}
}

// settleResults charges the rest of what the results owe and settles the
// units they held: the message has been answered (or the connection
// ended).
func (c *conn) settleResults(rcs []*resultCharge) {
	for _, rc := range rcs {
		if rc.settled {
			continue
		}
		rc.settled = true
		c.chargeResult(rc)
		c.settleHold(rc)
	}
}

// settleHold spends what the held units covered (the first row and byte;
// nothing of an empty result) and gives back the rest.
func (c *conn) settleHold(rc *resultCharge) {
	if rc.held {
		return
	}
	rc.held = true
	used := map[string]int64{}
	if rc.res.Rows != "" {
		used[rc.res.Rows] = min(rc.rows, 1)
	}
	if rc.res.Bytes != "" {
		used[rc.res.Bytes] = min(rc.bytes, 1)
	}
	if c.p.Metrics != nil {
		c.p.Metrics.result(rc.rule, used[rc.res.Rows], used[rc.res.Bytes])
	}
	rc.t.Settle(used)
	rc.t.End(0, false)
}

// countRow counts a DataRow of n bytes to the result of the message the
// server is answering, charging a chunk when one is due.
func (c *conn) countRow(n int) {
	c.mu.Lock()
	rc := c.m.dataRow(n)
	c.mu.Unlock()
	if rc != nil {
		c.chargeResult(rc)
	}
}

// chargeUpTo charges n of res, or what room a quota has left when it has
// less. A rate paces the charge (and so the relay of the rows), within
// askTimeout.
func (c *conn) chargeUpTo(rc *resultCharge, res string, n int64) {
	ctx, cancel := context.WithTimeout(c.ctx, askTimeout)
	defer cancel()
	for try := 0; try < 2; try++ {
		t, err := c.p.Admitter.Admit(ctx, admission.Request{Subtask: rc.subtask, Charges: map[string]int64{res: n}})
		if err == nil {
			if t != nil {
				t.End(0, false)
			}
			return
		}
		den := admission.Deny(ctx, err, "", 0)
		if q := den.Quota; den.Cause == admission.CauseQuota && q != nil && q.Limit-q.Used > 0 && q.Limit-q.Used < n && try == 0 {
			n = q.Limit - q.Used
			continue
		}
		if den.Cause != admission.CauseQuota && c.p.Logger != nil {
			c.p.Logger.LogAttrs(context.Background(), slog.LevelWarn, "governor-proxy: a statement's result could not be charged",
				slog.String("rule", rc.rule), slog.String("subtask", rc.subtask), slog.String("resource", res),
				slog.Int64("amount", n), slog.String("err", den.Error()))
		}
		return
	}
}
