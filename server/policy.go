package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// Policy: how caps are enforced (hard, soft with a burst, warn_only), as
// configured and as edited through SetCaps, and where each cap stands
// (GetCapStatus).

// modesEdit adds to edit what makes v's modes the wanted ones, given the
// caps v will have (wantQ, wantL): a mode no longer wanted becomes hard
// again where its cap stays (a removed cap takes its mode with it).
func modesEdit(edit *engine.CapsEdit, v engine.NodeView, wantQ, wantL map[string]int64, modesQ, modesL map[string]engine.CapMode) bool {
	diff := func(have, want map[string]engine.CapMode, caps map[string]int64) map[string]engine.CapMode {
		out := map[string]engine.CapMode{}
		for k, w := range want {
			if have[k] != w {
				out[k] = w
			}
		}
		for k := range have {
			if _, ok := want[k]; !ok {
				if _, capped := caps[k]; capped {
					out[k] = engine.CapMode{}
				}
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	edit.QuotaModes, edit.LimitModes = diff(v.QuotaModes, modesQ, wantQ), diff(v.LimitModes, modesL, wantL)
	return edit.QuotaModes != nil || edit.LimitModes != nil
}

// capModes reads a request's modes, refusing a mode name it does not know.
func capModes(what string, in map[string]*governorpb.CapMode) (map[string]engine.CapMode, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[string]engine.CapMode, len(in))
	for k, pm := range in {
		var cm engine.CapMode
		if name := pm.GetMode(); name != "" {
			m, err := engine.ParseMode(name)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "%s[%q]: %v", what, k, err)
			}
			cm.Mode = m
		}
		cm.Burst = pm.GetBurst()
		out[k] = cm
	}
	return out, nil
}

func toCapModes(in map[string]engine.CapMode) map[string]*governorpb.CapMode {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*governorpb.CapMode, len(in))
	for k, cm := range in {
		out[k] = &governorpb.CapMode{Mode: cm.Mode.String(), Burst: cm.Burst}
	}
	return out
}

// GetCapStatus tells where every cap on a node's chain stands.
func (s *Server) GetCapStatus(ctx context.Context, req *governorpb.GetCapStatusRequest) (*governorpb.CapStatusReport, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.CapStatusReport, error) {
		status := s.eng.Status
		if req.GetShadow() {
			status = s.eng.ShadowStatus
		}
		st, err := status(sid, engine.NodeID(req.GetNodeId()))
		if err != nil {
			return nil, err
		}
		rates, err := s.eng.RateStatus(sid, engine.NodeID(req.GetNodeId()))
		if err != nil {
			return nil, err
		}
		periods, err := s.eng.PeriodStatus(sid, engine.NodeID(req.GetNodeId()))
		if err != nil {
			return nil, err
		}
		out := toCapStatusReport(st)
		out.Rates = toRateStatus(rates)
		withPeriods(out, periods)
		return out, nil
	})
}

func toCapStatusReport(st []engine.CapStatus) *governorpb.CapStatusReport {
	out := &governorpb.CapStatusReport{State: engine.Worst(st).String()}
	for _, c := range st {
		out.Caps = append(out.Caps, &governorpb.CapStatus{NodeId: int64(c.Node), NodeName: c.NodeName, Limit: c.Limit,
			Name: c.Name, Mode: &governorpb.CapMode{Mode: c.Mode.String(), Burst: c.Burst}, Cap: c.Cap, Used: c.Used,
			Remaining: c.Remaining, State: c.State.String(), Threshold: int32(c.Threshold)})
	}
	return out
}

// policyCollector serves each tenant's overage state as a gauge, one
// series per tenant and state (1 for the state it is in), so the number of
// series follows the configuration.
type policyCollector struct{ s *Server }

var descOverage = prometheus.NewDesc("governor_overage_state",
	"1 for the state each tenant is in against its own caps (within, near, soft_exceeded, hard_exceeded), 0 for the others.",
	[]string{"tenant", "state"}, nil)

func (policyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descOverage }

func (c policyCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.eng == nil {
		return
	}
	for tenant, st := range c.s.eng.TenantOverage() {
		for o := engine.Within; o <= engine.HardExceeded; o++ {
			v := 0.0
			if o == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descOverage, prometheus.GaugeValue, v, tenant, o.String())
		}
	}
}

// newWarnings counts the warnings events carry: every charge or grant that
// went past a soft or warn_only cap, by mode and by quota or limit.
func newWarnings() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_cap_warnings_total",
		Help: "Charges and grants that went past a cap without being refused, by the cap's mode (soft: within its burst; warn_only: a would-be denial) and kind (quota or limit)."},
		[]string{"mode", "kind"})
}

// warned counts ev's warnings. It runs under the engine's lock.
func (m *metrics) warned(ev *engine.Event) {
	for _, w := range ev.Warnings {
		kind := "quota"
		if w.Limit {
			kind = "limit"
		}
		m.warnings.WithLabelValues(w.Mode.String(), kind).Inc()
	}
}

// SetTenantState sets a tenant's state (engine/tenantstate.go).
func (s *Server) SetTenantState(ctx context.Context, req *governorpb.SetTenantStateRequest) (*governorpb.Node, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	st, err := engine.ParseTenantState(req.GetState())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return call(s, ctx, req.GetRequestId(), func(sid engine.SessionID) (*governorpb.Node, error) {
		v, err := s.eng.SetTenantState(sid, engine.NodeID(req.GetNodeId()), st, req.GetReason(), req.GetRevoke(), req.GetRequestId())
		if err != nil {
			return nil, err
		}
		s.log.Info("tenant state set", "tenant", v.Name, "state", st.String(), "reason", req.GetReason(), "revoke", req.GetRevoke())
		return toNode(v), nil
	})
}

// tenantRefusal is the detail of work refused for its tenant's state.
func tenantRefusal(te *engine.TenantStateError) *governorpb.TenantRefusal {
	return &governorpb.TenantRefusal{Tenant: te.Tenant, State: te.State.String(), Reason: te.Reason, Refused: te.What, Cause: causeOf(te)}
}

// DryRun decides a request as ChargeAndAcquire would, charging and holding
// nothing, and counts the answer (governor_dry_runs_total). With record
// (a shadow rule's request) it is decided counting the shadow ledger, and
// its charges, when admitted, are recorded in the ledger, committed before
// the answer like any event.
func (s *Server) DryRun(ctx context.Context, req *governorpb.DryRunRequest) (*governorpb.DryRunResponse, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkCharges("charges", req.GetCharges()); err != nil {
		return nil, err
	}
	r := engine.AcquireRequest{Node: engine.NodeID(req.GetNodeId()), Class: req.GetClass(), Charges: req.GetCharges(), Write: req.GetWrite()}
	rid := req.GetRequestId()
	if !req.GetRecord() {
		rid = ""
	}
	return call(s, ctx, rid, func(sid engine.SessionID) (*governorpb.DryRunResponse, error) {
		var (
			dr  engine.DryRun
			err error
		)
		if req.GetRecord() {
			dr, err = s.eng.Shadow(sid, r, rid)
		} else {
			dr, err = s.eng.DryRun(sid, r, req.GetShadow())
		}
		if err != nil {
			return nil, err
		}
		resp := dryRunResponse(dr)
		s.metrics.dryRuns.WithLabelValues(resp.GetOutcome()).Inc()
		return resp, nil
	})
}

// dryRunCauses are the causes a DryRun's answer names as its outcome; any
// other refusal reads "recalling" (a quota held by reservations being
// recalled).
var dryRunCauses = []governorpb.Cause{governorpb.Cause_CAUSE_QUOTA, governorpb.Cause_CAUSE_TASK_ENDED,
	governorpb.Cause_CAUSE_SUSPENDED, governorpb.Cause_CAUSE_READ_ONLY}

// dryRunOutcomes are DryRunResponse.outcome's values, for metrics that
// start at zero.
var dryRunOutcomes = dryRunOutcomeNames()

func dryRunOutcomeNames() []string {
	out := []string{"admitted", "wait"}
	for _, c := range dryRunCauses {
		out = append(out, c.WireName())
	}
	return append(out, "recalling")
}

func dryRunResponse(dr engine.DryRun) *governorpb.DryRunResponse {
	var (
		denial *engine.Denial
		tstate *engine.TenantStateError
	)
	resp := &governorpb.DryRunResponse{Outcome: "admitted"}
	switch cause := causeOf(dr.Err); {
	case dr.Err == nil && dr.Wait:
		resp.Outcome = "wait"
	case dr.Err == nil:
	case slices.Contains(dryRunCauses, cause):
		resp.Outcome, resp.Message = cause.WireName(), dr.Err.Error()
		if errors.As(dr.Err, &denial) {
			resp.Denial = toDenial(denial)
		}
		if errors.As(dr.Err, &tstate) {
			resp.TenantRefusal = tenantRefusal(tstate)
		}
	default:
		resp.Outcome, resp.Message = "recalling", dr.Err.Error()
	}
	return resp
}

func newDryRuns() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_dry_runs_total",
		Help: "DryRun answers (the sidecar's shadow rules), by outcome: admitted, wait, or the cause a real request would have been refused for."},
		[]string{"outcome"})
	for _, o := range dryRunOutcomes {
		c.WithLabelValues(o)
	}
	return c
}

// minimumsEdit adds to edit what makes v's minimums the wanted ones: only
// the lowered ones when lower is set (applied before anything is raised,
// so that the sum never passes the pool on the way), else the raised ones.
func minimumsEdit(edit *engine.CapsEdit, v engine.NodeView, want map[string]engine.Minimum, lower bool) bool {
	out := map[string]engine.Minimum{}
	for k, w := range want {
		if h := v.Minimums[k]; h != w && (w.Min <= h.Min) == lower {
			out[k] = w
		}
	}
	if lower {
		for k := range v.Minimums {
			if _, ok := want[k]; !ok {
				out[k] = engine.Minimum{}
			}
		}
	}
	if len(out) == 0 {
		return false
	}
	edit.Minimums = out
	return true
}

// lowerMinimums applies the configuration's lowered and removed minimums
// of the tenants that exist, before the root's limits and the raises.
func (s *Server) lowerMinimums() error {
	for _, t := range s.cfg.Tenants {
		v, err := s.eng.Lookup(engine.System, t.Name)
		if err != nil {
			continue // made later, with its minimums
		}
		var edit engine.CapsEdit
		if minimumsEdit(&edit, v, t.Minimums, true) {
			if _, err := s.eng.SetCaps(engine.System, v.ID, edit, ""); err != nil {
				return fmt.Errorf("configure tenant %q: %w", t.Name, err)
			}
		}
	}
	return nil
}

func capMinimums(in map[string]*governorpb.Minimum) map[string]engine.Minimum {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]engine.Minimum, len(in))
	for k, m := range in {
		mn := engine.Minimum{Min: m.GetMin()}
		if m.GetValidFrom() != nil {
			mn.From = m.GetValidFrom().AsTime().UnixNano()
		}
		if m.GetValidUntil() != nil {
			mn.Until = m.GetValidUntil().AsTime().UnixNano()
		}
		out[k] = mn
	}
	return out
}

func toMinimums(in map[string]engine.Minimum) map[string]*governorpb.Minimum {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*governorpb.Minimum, len(in))
	for k, m := range in {
		pm := &governorpb.Minimum{Min: m.Min}
		if m.From != 0 {
			pm.ValidFrom = timestamppb.New(time.Unix(0, m.From))
		}
		if m.Until != 0 {
			pm.ValidUntil = timestamppb.New(time.Unix(0, m.Until))
		}
		out[k] = pm
	}
	return out
}
