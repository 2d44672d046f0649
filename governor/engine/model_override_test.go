package engine

import "time"

// The model's own account of temporary overrides (override.go): which caps
// are overridden, what each goes back to (the value before the first
// override still pending on it) and when. It checks every EvCapsSet's
// audited old values and every EvCapsReverted against it, and the driver
// checks after each Reap that nothing due is still pending.

type modelOverride struct {
	restore int64 // NoCap for no cap
	until   int64
}

// capsSet notes an EvCapsSet's effect on the overrides, before its caps
// are applied to the model, and checks the old values it audits.
func (m *model) capsSet(ev Event) {
	c := ev.Caps
	m.checkAuditedModes(ev)
	for _, side := range []struct {
		limit bool
		set   map[string]int64
		have  map[string]int64
	}{{false, c.Quotas, m.quotas[ev.Node]}, {true, c.Limits, m.limits[ev.Node]}} {
		for k := range side.set {
			old := NoCap
			if v, ok := side.have[k]; ok {
				old = v
			}
			if ev.Audit != nil && ev.Audit.Old.valueOf(side.limit, k) != old {
				m.failf("event %d audits %s's old value on node %d as %d; it was %d", ev.Seq, k, ev.Node, ev.Audit.Old.valueOf(side.limit, k), old)
			}
			key := modeKey{side.limit, k}
			if ev.Audit == nil || ev.Audit.Until == 0 {
				delete(m.overrides[ev.Node], key) // a permanent edit cancels the revert
				continue
			}
			o, pending := m.overrides[ev.Node][key]
			if !pending {
				o.restore = old
			}
			o.until = ev.Audit.Until
			if m.overrides[ev.Node] == nil {
				m.overrides[ev.Node] = map[modeKey]modelOverride{}
			}
			m.overrides[ev.Node][key] = o
		}
	}
}

// checkAuditedModes checks the old modes and minimums an EvCapsSet audits
// against the model's, before the edit is applied: what each mode and
// minimum edited was (hard, and none, where there was none).
func (m *model) checkAuditedModes(ev Event) {
	if ev.Audit == nil {
		return
	}
	c, old := ev.Caps, ev.Audit.Old
	for _, side := range []struct {
		limit     bool
		set, told map[string]CapMode
	}{{false, c.QuotaModes, old.QuotaModes}, {true, c.LimitModes, old.LimitModes}} {
		for k := range side.set {
			if was, got := m.modes[ev.Node][modeKey{side.limit, k}], side.told[k]; got != was {
				m.failf("event %d audits the old mode of %s on node %d as %+v; it was %+v", ev.Seq, k, ev.Node, got, was)
			}
		}
	}
	for k := range c.Minimums {
		if was, got := m.mins[ev.Node][k], old.Minimums[k]; got != was {
			m.failf("event %d audits the old minimum of %s on node %d as %+v; it was %+v", ev.Seq, k, ev.Node, got, was)
		}
	}
}

// capsReverted checks an EvCapsReverted: it puts back, no sooner than they
// are due, caps that are overridden, each to what it was before its first
// pending override.
func (m *model) capsReverted(ev Event) {
	c := ev.Caps
	if c == nil || len(c.Quotas)+len(c.Limits) == 0 {
		m.failf("event %d reverts nothing on node %d", ev.Seq, ev.Node)
		return
	}
	for _, side := range []struct {
		limit bool
		set   map[string]int64
	}{{false, c.Quotas}, {true, c.Limits}} {
		for k, v := range side.set {
			key := modeKey{side.limit, k}
			o, pending := m.overrides[ev.Node][key]
			switch {
			case !pending:
				m.failf("event %d reverts %s on node %d, which has no override pending", ev.Seq, k, ev.Node)
			case o.until > ev.At:
				m.failf("event %d reverts %s on node %d at %d, before its override ends at %d", ev.Seq, k, ev.Node, ev.At, o.until)
			case o.restore != v:
				m.failf("event %d reverts %s on node %d to %d; before the override it was %d", ev.Seq, k, ev.Node, v, o.restore)
			}
			delete(m.overrides[ev.Node], key)
		}
	}
	m.quotas[ev.Node] = overlay(m.quotas[ev.Node], c.Quotas)
	m.limits[ev.Node] = overlay(m.limits[ev.Node], c.Limits)
	m.setModes(ev.Node, c) // a cap reverted to none loses its mode
}

// checkOverridesDue fails if, after a Reap at now, an override that was
// due is still pending.
func (w *world) checkOverridesDue(now int64) {
	for _, id := range sortedKeys(w.m.overrides) {
		if w.e.nodes[id] == nil { // reclaimed, with whatever it had pending
			delete(w.m.overrides, id)
			continue
		}
		for key, o := range w.m.overrides[id] {
			if o.until <= now {
				w.fail("override of %s on node %d was due at %d; Reap at %d left it", key.name, id, o.until, now)
			}
		}
	}
}

// randOverride is how long a caps edit lasts: most edits are permanent,
// and some of those that set only quotas and limits are temporary
// overrides. It draws from a stream of its own, so that the rest of a
// seed's run stays as it was before overrides were made.
func (w *world) randOverride(edit CapsEdit) Audit {
	a := Audit{Reason: "randomized"}
	only := edit.DefaultQuotas == nil && edit.DefaultLimits == nil && edit.Weight == nil && edit.Priority == nil &&
		edit.Deadline == nil && edit.QuotaModes == nil && edit.LimitModes == nil && len(edit.Quotas)+len(edit.Limits) > 0
	if w.orng.Intn(3) != 0 || !only {
		return a
	}
	a.For = time.Duration(1+w.orng.Intn(20)) * time.Second
	return a
}
