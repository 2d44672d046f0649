package engine

import (
	"fmt"
	"math"
	"slices"
)

// This file holds how a cap is enforced (its Mode) and where a node stands
// against its caps (its Overage). A mode is part of a cap: it is set with
// the cap (CapsEdit.QuotaModes, LimitModes), travels in the EvCapsSet, is
// kept by snapshots and goes when the cap is removed. A charge or grant that
// a soft or warn_only cap lets past the cap carries Warnings in its event,
// so the log records every would-be denial.

// Mode is how a cap is enforced.
type Mode uint8

const (
	// ModeHard refuses whatever would go past the cap (the default).
	ModeHard Mode = iota
	// ModeSoft lets work go past the cap by up to the cap's burst, with a
	// warning, and refuses past cap plus burst as a hard cap does.
	ModeSoft
	// ModeWarnOnly never refuses: it records what a hard cap would have
	// refused.
	ModeWarnOnly
)

var modeNames = [...]string{ModeHard: "hard", ModeSoft: "soft", ModeWarnOnly: "warn_only"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode reads a mode's name: hard, soft or warn_only.
func ParseMode(s string) (Mode, error) {
	if i := slices.Index(modeNames[:], s); i >= 0 {
		return Mode(i), nil
	}
	return 0, invalid("mode %q is not one of hard, soft, warn_only", s)
}

// CapMode is a cap's enforcement: its mode and, for ModeSoft, how far past
// the cap work may go. The zero value is a hard cap.
type CapMode struct {
	Mode  Mode  `json:"m,omitempty"`
	Burst int64 `json:"b,omitempty"`
}

func (c CapMode) validate(name string) error {
	switch {
	case c.Mode > ModeWarnOnly:
		return invalid("%s: mode %d is not one of hard, soft, warn_only", name, c.Mode)
	case c.Burst < 0:
		return invalid("%s: burst %d is negative", name, c.Burst)
	case c.Burst > 0 && c.Mode != ModeSoft:
		return invalid("%s: a burst applies only to a soft cap, not %s", name, c.Mode)
	}
	return nil
}

// enforced is the usage at which g refuses more, and whether it refuses at
// all: the cap for a hard cap, cap plus burst (saturating) for a soft one,
// never for warn_only or no cap.
func (g *gauge) enforced() (int64, bool) {
	if !g.capped || g.mode == ModeWarnOnly {
		return 0, false
	}
	if g.mode == ModeSoft {
		if g.cap > math.MaxInt64-g.burst {
			return math.MaxInt64, true
		}
		return g.cap + g.burst, true
	}
	return g.cap, true
}

// setMode sets the enforcement of an existing cap; the caller has checked
// there is one.
func (gs *gauges) setMode(k string, c CapMode) {
	g := gs.at(k)
	g.mode, g.burst = c.Mode, c.Burst
}

// modes returns the caps' enforcement other than hard, nil when all are.
func (gs gauges) modes() map[string]CapMode {
	var out map[string]CapMode
	for k, g := range gs {
		if g.capped && (g.mode != ModeHard || g.burst != 0) {
			if out == nil {
				out = make(map[string]CapMode)
			}
			out[k] = CapMode{Mode: g.mode, Burst: g.burst}
		}
	}
	return out
}

// modeOf is k's enforcement (hard where there is no cap).
func (gs gauges) modeOf(k string) CapMode {
	if g := gs[k]; g != nil && g.capped {
		return CapMode{Mode: g.mode, Burst: g.burst}
	}
	return CapMode{}
}

// checkModes refuses a mode for a name that will have no cap once edit is
// applied to n: a mode is part of a cap.
func (n *node) checkModes(edit *CapsEdit) error {
	for _, side := range []struct {
		what  string
		modes map[string]CapMode
		caps  map[string]int64
		have  gauges
	}{{"quota", edit.QuotaModes, edit.Quotas, n.quota}, {"limit", edit.LimitModes, edit.Limits, n.limit}} {
		for k := range side.modes {
			v, edited := side.caps[k]
			_, capped := side.have.capOf(k)
			if (edited && v == NoCap) || (!edited && !capped) {
				return invalid("%s %q has no cap on node %q to take a mode", side.what, k, n.name)
			}
		}
	}
	return nil
}

// Warning is a cap a charge or grant went past without being refused: a
// soft cap within its burst, or a warn_only cap where a hard one would have
// refused. It rides on the event that made the charge or grant.
type Warning struct {
	Node  NodeID `json:"n"`
	Limit bool   `json:"lim,omitempty"` // a limit (lease class), not a quota
	Name  string `json:"r"`
	Mode  Mode   `json:"m"`
	Used  int64  `json:"u"` // usage (or slots held) with this charge or grant, reservations included
	Cap   int64  `json:"c"`
}

// warnings lists the caps on n's chain that charges of quotas and slots
// more of class take past the cap without being refused. It is nil when
// none does, which is nearly always: it allocates only for a warning.
func (n *node) warnings(charges []Charge, class string, slots int64) []Warning {
	var out []Warning
	for a := n; a != nil; a = a.parent {
		for _, c := range charges {
			if g := a.quota[c.Resource]; g != nil && g.capped && g.mode != ModeHard && g.spent()+g.r+c.Amount > g.cap {
				out = append(out, Warning{Node: a.id, Name: c.Resource, Mode: g.mode, Used: g.spent() + g.r + c.Amount, Cap: g.cap})
			}
		}
		if slots > 0 {
			if g := a.limit[class]; g != nil && g.capped && g.mode != ModeHard && g.n+slots > g.cap {
				out = append(out, Warning{Node: a.id, Limit: true, Name: class, Mode: g.mode, Used: g.n + slots, Cap: g.cap})
			}
		}
	}
	return out
}

// Overage is where a cap, or a node, stands: within it, near it, over it
// but not refusing (soft exceeded), or refusing more (hard exceeded).
type Overage uint8

const (
	Within Overage = iota
	Near
	SoftExceeded
	HardExceeded
)

var overageNames = [...]string{Within: "within", Near: "near", SoftExceeded: "soft_exceeded", HardExceeded: "hard_exceeded"}

func (o Overage) String() string {
	if int(o) < len(overageNames) {
		return overageNames[o]
	}
	return fmt.Sprintf("overage(%d)", uint8(o))
}

// DefaultNear are the near-limit thresholds, in percent of a cap, used
// when Config.Near is empty.
var DefaultNear = []int{80, 90}

// CapStatus is where one cap stands.
type CapStatus struct {
	Node     NodeID
	NodeName string
	Limit    bool // a limit (lease class), not a quota
	Name     string
	Mode     Mode
	Cap      int64
	Burst    int64
	// Used is what counts against the cap: usage and unspent reservations
	// for a quota, slots held for a limit.
	Used int64
	// Remaining is how much more fits before the cap itself (0 when at or
	// over it); a soft cap's burst is not counted.
	Remaining int64
	State     Overage
	// Threshold is the highest near threshold (percent) Used has reached,
	// 0 when none.
	Threshold int
}

// statusWith is where g stands, with the near thresholds near (ascending),
// counting extra units as used too: a node's shadow ledger, for a shadow
// rule's requests (ShadowStatus); 0 otherwise.
func (g *gauge) statusWith(extra int64, near []int) (Overage, int) {
	used := g.counted(extra)
	threshold := 0
	for _, t := range near {
		// used/cap >= t/100, in floats so that no product overflows; a cap
		// of 0 is reached at once.
		if float64(used)*100 >= float64(g.cap)*float64(t) {
			threshold = t
		}
	}
	eff, refuses := g.enforced()
	switch {
	case refuses && used >= eff:
		return HardExceeded, threshold
	case used > g.cap:
		return SoftExceeded, threshold
	case threshold > 0:
		return Near, threshold
	}
	return Within, 0
}

func (e *Engine) capStatus(a *node, limit bool, k string, g *gauge, shadow bool) CapStatus {
	var extra int64
	if shadow && !limit {
		extra = a.shadow[k]
	}
	st, th := g.statusWith(extra, e.near)
	used := g.counted(extra)
	return CapStatus{Node: a.id, NodeName: a.name, Limit: limit, Name: k, Mode: g.mode, Cap: g.cap, Burst: g.burst,
		Used: used, Remaining: max(g.cap-used, 0), State: st, Threshold: th}
}

// Status lists where every cap on id's chain stands, from id up to the
// root, quotas before limits on each node, each sorted by name. It reads
// under the lock and emits nothing.
func (e *Engine) Status(sid SessionID, id NodeID) ([]CapStatus, error) {
	return e.status(sid, id, false)
}

// ShadowStatus is Status for a shadow rule's requests: each quota's use
// counts its node's shadow ledger as spent, as DryRun with shadow decides
// (dryrun.go), so what remains and the state are what enforcing the rule
// would meet. Limits read as in Status: shadow requests hold nothing.
func (e *Engine) ShadowStatus(sid SessionID, id NodeID) ([]CapStatus, error) {
	return e.status(sid, id, true)
}

func (e *Engine) status(sid SessionID, id NodeID, shadow bool) ([]CapStatus, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, err := e.sessionTarget(sid, id, e.tick())
	if err != nil {
		return nil, err
	}
	var out []CapStatus
	for a := n; a != nil; a = a.parent {
		out = e.appendStatus(out, a, shadow)
	}
	return out, nil
}

func (e *Engine) appendStatus(out []CapStatus, a *node, shadow bool) []CapStatus {
	for _, side := range []struct {
		limit bool
		gs    gauges
	}{{false, a.quota}, {true, a.limit}} {
		for _, k := range sortedNames(side.gs) {
			if g := side.gs[k]; g.capped {
				out = append(out, e.capStatus(a, side.limit, k, g, shadow))
			}
		}
	}
	return out
}

func sortedNames(gs gauges) []string {
	out := make([]string, 0, len(gs))
	for k := range gs {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Worst is the worst state among statuses (Within for none).
func Worst(statuses []CapStatus) Overage {
	w := Within
	for _, s := range statuses {
		w = max(w, s.State)
	}
	return w
}

// TenantOverage is each open tenant's state against its own caps, by name,
// for a bounded gauge in metrics. It emits nothing.
func (e *Engine) TenantOverage() map[string]Overage {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]Overage, len(e.root.open))
	for name, t := range e.root.open {
		out[name] = Worst(e.appendStatus(nil, t, false))
	}
	return out
}

// validNear checks near-limit thresholds: ascending percentages in 1..100.
func validNear(near []int) error {
	for i, t := range near {
		if t < 1 || t > 100 {
			return invalid("near threshold %d%% is not between 1 and 100", t)
		}
		if i > 0 && t <= near[i-1] {
			return invalid("near thresholds %v are not ascending", near)
		}
	}
	return nil
}

// restoreModes installs a snapshot node's modes, refusing one without a cap
// or out of range.
func restoreModes(n *node, v NodeView) error {
	for _, side := range []struct {
		modes map[string]CapMode
		gs    *gauges
	}{{v.QuotaModes, &n.quota}, {v.LimitModes, &n.limit}} {
		for k, m := range side.modes {
			if _, ok := side.gs.capOf(k); !ok || m.validate(k) != nil {
				return fmt.Errorf("%w: snapshot node %d has mode %+v for %q", ErrCorrupt, v.ID, m, k)
			}
			side.gs.setMode(k, m)
		}
	}
	return nil
}
