package admission

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// CapReader reads, from governord, where the caps over a subtask's node
// stand (its own and every ancestor's): what the sidecar shows as IETF
// RateLimit headers, Governor-Warning and pgwire notices. The figures are
// the budget as a caller of this sidecar can use it: units the sidecar
// holds reserved and unspent count as left, not as used. With shadow, they
// are what a shadow rule's requests meet: each quota's shadow ledger
// counts as spent, as the rule's dry runs count it. Package budget's
// Admitter is one.
type CapReader interface {
	CapStatus(ctx context.Context, subtask string, shadow bool) (CapReport, error)
}

// CapReport is where the caps over a node stand, as governord says.
type CapReport struct {
	Caps []CapState
}

// CapState is one cap.
type CapState struct {
	NodeID    int64
	Node      string // the node's name
	Limit     bool   // a limit (lease class), not a quota (resource)
	Name      string
	Mode      string // hard, soft, warn_only
	Cap       int64
	Used      int64 // usage and unspent reserved units; slots held for a limit
	Remaining int64 // before the cap itself
	State     string
	Threshold int // the highest near threshold reached, percent
	// Period is a quota's period ("month", "10s") and ResetAt when it
	// next resets; empty and zero for one that never resets.
	Period  string
	ResetAt time.Time
}

// The states of a cap, as governord names them; Within is the only one
// that warns nobody.
const (
	StateWithin       = "within"
	StateNear         = "near"
	StateSoftExceeded = "soft_exceeded"
	StateHardExceeded = "hard_exceeded"
)

var stateRank = map[string]int{StateWithin: 0, StateNear: 1, StateSoftExceeded: 2, StateHardExceeded: 3}

// Tightest is the quota cap with the least remaining among those over
// resources (every quota when resources is empty), and whether there is
// one. Ties go to the cap nearest the node.
func (r CapReport) Tightest(resources map[string]int64) (CapState, bool) {
	var best CapState
	found := false
	for _, c := range r.Caps {
		if c.Limit {
			continue
		}
		if len(resources) > 0 {
			if _, ok := resources[c.Name]; !ok {
				continue
			}
		}
		if !found || c.Remaining < best.Remaining {
			best, found = c, true
		}
	}
	return best, found
}

// Worst is the cap in the worst state (quotas and limits alike, the one
// nearest the node on a tie) among those over work that charges resources
// and holds a slot of class: their quotas and that limit, or every cap when
// it names neither; and whether any is near or over. A cap the work does
// not touch is not its warning.
func (r CapReport) Worst(resources map[string]int64, class string) (CapState, bool) {
	var worst CapState
	found := false
	every := len(resources) == 0 && class == ""
	for _, c := range r.Caps {
		if stateRank[c.State] == 0 {
			continue
		}
		if !every {
			if _, charged := resources[c.Name]; c.Limit && c.Name != class || !c.Limit && !charged {
				continue
			}
		}
		if !found || stateRank[c.State] > stateRank[worst.State] {
			worst, found = c, true
		}
	}
	return worst, found
}

// Warning is the text of a Governor-Warning header (and of a pgwire
// notice's detail) for c: its state, then the cap as key=value pairs.
//
//	near; quota="tokens"; node="payments"; used=85; cap=100; threshold=80
func (c CapState) Warning() string {
	kind := "quota"
	if c.Limit {
		kind = "limit"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s; %s=%s; node=%s; used=%d; cap=%d", c.State, kind, strconv.Quote(c.Name), strconv.Quote(c.Node), c.Used, c.Cap)
	if c.Threshold > 0 {
		fmt.Fprintf(&b, "; threshold=%d", c.Threshold)
	}
	if c.Mode != "" && c.Mode != "hard" {
		fmt.Fprintf(&b, "; mode=%s", c.Mode)
	}
	return b.String()
}

// PolicyName names c in RateLimit-Policy and RateLimit: the resource and
// the node whose cap it is.
func (c CapState) PolicyName() string { return c.Name + "@" + c.Node }

// DryRunner asks governord how it would answer a request had its rule been
// enforced, charging and holding nothing, and records its would-be charges
// in the shadow ledger: what a shadow rule does instead of admitting.
// Package budget's Admitter is one.
type DryRunner interface {
	DryRun(ctx context.Context, r Request) (DryRunResult, error)
}

// WriteChecker tells whether a write may go on in work admitted as a read:
// the refusal a write gets while its tenant is read_only, or nil. Package
// budget's Admitter is one.
type WriteChecker interface {
	CheckWrite(ctx context.Context, r Request) error
}

// DryRunResult is governord's answer to a dry run.
type DryRunResult struct {
	// Outcome is "admitted", "wait" (a lease would queue), or the cause a
	// real request would have been refused for: "quota", "task-ended",
	// "suspended", "read-only", "recalling".
	Outcome string
	// Message says the refusal in words.
	Message string
}

// Denied reports whether a real request would have been refused.
func (r DryRunResult) Denied() bool {
	return r.Outcome != "admitted" && r.Outcome != "wait" && r.Outcome != ""
}
