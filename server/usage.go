package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/store"
	"github.com/governor-project/governor/usage"
)

// Usage records (package usage) are folded from the events on the log's
// writer, in order, and go into the store with them, in the same
// transaction; refusals, which are not events, are counted as they are
// answered and go with the next commit.

// DefaultUsageRetention is how long usage records are kept unless
// store.usage_retention says otherwise.
const DefaultUsageRetention = 35 * 24 * time.Hour

// defaultUsageWindow is what GetUsage covers when it is not told.
const defaultUsageWindow = 24 * time.Hour

// encodeWithUsage encodes ev with the usage records it (and the refusals
// counted since the last commit) make.
func (s *Server) encodeWithUsage(ev engine.Event) (store.Record, error) {
	rec, err := encodeEvent(ev)
	if err != nil {
		return rec, err
	}
	s.usage.Add(ev)
	for _, r := range s.usage.Take() {
		rec.Usage = append(rec.Usage, storeRow(r))
	}
	return rec, nil
}

// storeRow is a usage record as the store keeps it.
func storeRow(r usage.Record) store.UsageRow {
	m := store.MergeAdd
	switch r.Kind {
	case usage.Peak:
		m = store.MergeMax
	case usage.HeldEnd:
		m = store.MergeSet
	}
	return store.UsageRow{Tenant: r.Tenant, Task: r.Task, Minute: r.Minute, Kind: string(r.Kind),
		Name: r.Name, TenantName: r.TenantName, TaskName: r.TaskName, Amount: r.Amount, Merge: m}
}

// usageWriter stores usage records at once, outside any append: the
// stores do.
type usageWriter interface {
	AddUsage(ctx context.Context, rows []store.UsageRow) error
}

// denied counts err against node when it refuses the work (a quota spent,
// a bound, an ended task, a wait given up), and returns it.
func (s *Server) denied(node int64, err error) error {
	if err == nil {
		return nil
	}
	if cause := usageCause(err); cause != "" {
		now := s.cfg.Clock.Now().UnixNano()
		s.usage.Deny(engine.NodeID(node), cause, now)
		s.recent.add(recentDenial{at: now, node: node, cause: cause})
	}
	return err
}

// usageCause is what usage records count err under (causeOf's name, and a
// spent quota's resource); "" for an error they do not count: no
// refusal, or a refusal for a rate (retryable) or for the tenant's state
// (the operator's doing).
func usageCause(err error) string {
	var (
		denial *engine.Denial
		tstate *engine.TenantStateError
	)
	switch cause := causeOf(err); {
	case errors.As(err, &denial):
		return cause.UsageName(denial.Resource)
	case errors.As(err, &tstate):
	case cause == governorpb.Cause_CAUSE_BOUND, cause == governorpb.Cause_CAUSE_TASK_ENDED,
		cause == governorpb.Cause_CAUSE_WAIT_ABANDONED:
		return cause.UsageName("")
	}
	return ""
}

// quotaCausePrefix starts the cause of a spent quota whose resource is
// named; maxCauseLen is the longest cause a sidecar may report.
var (
	quotaCausePrefix = governorpb.Cause_CAUSE_QUOTA.UsageName("") + ":"
	maxCauseLen      = len(quotaCausePrefix) + engine.MaxNameLen
)

// Bounds of a ReportDenials call.
const (
	maxDenialReports = 1000
	maxDenialCount   = 1_000_000
)

// ReportDenials counts refusals a sidecar decided by itself, from what its
// session holds, in the usage records of the nodes they were for, as
// governord counts its own (denied). They are no events; unlike governord's
// own refusals, which go with the next commit, they are stored before the
// answer: a sidecar forgets what it reported once told it is counted, so a
// crash before the next commit must not lose them.
func (s *Server) ReportDenials(ctx context.Context, req *governorpb.ReportDenialsRequest) (*governorpb.ReportDenialsResponse, error) {
	sid, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	reports := req.GetDenials()
	if len(reports) > maxDenialReports {
		return nil, status.Errorf(codes.InvalidArgument, "%d denial counts in one report; at most %d", len(reports), maxDenialReports)
	}
	for i, d := range reports {
		if err := required("node_id", d.GetNodeId()); err != nil {
			return nil, err
		}
		if err := validCause(d.GetCause()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "denials[%d]: %v", i, err)
		}
		if c := d.GetCount(); c < 1 || c > maxDenialCount {
			return nil, status.Errorf(codes.InvalidArgument, "denials[%d]: count %d is not between 1 and %d", i, c, maxDenialCount)
		}
		if _, err := s.eng.Get(sid, engine.NodeID(d.GetNodeId())); err != nil {
			return nil, toStatus(err)
		}
	}
	w, ok := s.st.(usageWriter)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this store cannot keep reported refusals")
	}
	now := s.cfg.Clock.Now().UnixNano()
	var rows []store.UsageRow
	for _, d := range reports {
		if r, ok := s.usage.DenialRecord(engine.NodeID(d.GetNodeId()), d.GetCause(), now, d.GetCount()); ok {
			rows = append(rows, storeRow(r))
		}
	}
	if len(rows) > 0 {
		if err := w.AddUsage(ctx, rows); err != nil {
			s.log.Warn("storing a sidecar's refusal counts failed", "err", err)
			return nil, status.Errorf(codes.Unavailable, "the refusal counts were not stored: %v", err)
		}
	}
	for _, d := range reports {
		s.recent.add(recentDenial{at: now, node: d.GetNodeId(), cause: d.GetCause()})
	}
	return &governorpb.ReportDenialsResponse{}, nil
}

// validCause checks a reported cause's name: lower-case letters, digits,
// '-', '_' and '.', with at most one ':' (as in "quota:tokens").
// The part after "quota:" is a resource's name, which may be any name the
// engine takes (upper case, '/', ...) but for ':'.
func validCause(c string) error {
	if c == "" || len(c) > maxCauseLen {
		return fmt.Errorf("cause %q must be 1 to %d bytes", c, maxCauseLen)
	}
	if res, ok := strings.CutPrefix(c, quotaCausePrefix); ok {
		if strings.Contains(res, ":") {
			return fmt.Errorf("cause %q: a resource named in a cause holds no ':'", c)
		}
		if err := engine.ValidName("resource", res); err != nil {
			return fmt.Errorf("cause %q: %w", c, err)
		}
		return nil
	}
	colons := 0
	for _, r := range c {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		case r == ':' && colons == 0:
			colons++
		default:
			return fmt.Errorf("cause %q may hold only lower-case letters, digits, '-', '_', '.' and one ':'", c)
		}
	}
	return nil
}

// usageCutoff is the minute before which usage records are past the
// retention at now.
func (s *Server) usageCutoff(now time.Time) int64 {
	keep := s.cfg.Store.UsageRetention
	if keep == 0 {
		keep = DefaultUsageRetention
	}
	return usage.MinuteOf(now.Add(-keep).UnixNano())
}

// trimUsage deletes the usage records of the minutes before before
// (housekeeping.go).
func (s *Server) trimUsage(ctx context.Context, before int64) {
	u, ok := s.st.(store.UsageReader)
	if !ok {
		return
	}
	if err := u.TrimUsage(ctx, before, string(usage.HeldEnd)); err != nil {
		s.log.Warn("trimming old usage records failed; the next minute's trim tries again", "err", err)
	}
}

// The instants a usage window may name: unix nanoseconds that an int64
// holds (1677 to 2262), less an hour at each end so that rounding a
// window out to whole minutes and buckets does not overflow. A timestamp
// past them (protobuf's reach from year 1 to 9999) is taken as the
// nearest.
var (
	usageEarliest = time.Unix(0, math.MinInt64).Add(time.Hour)
	usageLatest   = time.Unix(0, math.MaxInt64).Add(-time.Hour)
)

func clampUsageTime(t time.Time) time.Time {
	switch {
	case t.Before(usageEarliest):
		return usageEarliest
	case t.After(usageLatest):
		return usageLatest
	}
	return t
}

func (s *Server) GetUsage(ctx context.Context, req *governorpb.GetUsageRequest) (*governorpb.UsageReport, error) {
	now := s.cfg.Clock.Now()
	to, from := now, now.Add(-defaultUsageWindow)
	if t := req.GetTo(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "to: %v", err)
		}
		to = t.AsTime()
		from = to.Add(-defaultUsageWindow)
	}
	if f := req.GetFrom(); f != nil {
		if err := f.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "from: %v", err)
		}
		from = f.AsTime()
	}
	from, to = clampUsageTime(from), clampUsageTime(to)
	if !from.Before(to) {
		return nil, status.Errorf(codes.InvalidArgument, "from %v is not before to %v", from, to)
	}
	if req.GetPer() != "" {
		return s.usagePer(ctx, req, from, to, now)
	}
	if _, ok := s.st.(store.UsageReader); !ok {
		return nil, status.Error(codes.Unimplemented, "this store keeps no usage records")
	}
	w := usage.Window{From: usage.MinuteOf(from.UnixNano()), To: usage.MinuteOf(to.UnixNano()-1) + 1, Now: now.UnixNano()}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.UsageReport, error) {
		if err := s.durable(ctx); err != nil { // what was answered before is in the records
			return nil, err
		}
		lines, err := s.minuteLines(ctx, w)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "read usage records: %v", err)
		}
		out := &governorpb.UsageReport{From: timestamppb.New(time.Unix(w.From*60, 0)), To: timestamppb.New(time.Unix(w.To*60, 0))}
		out.Lines = s.usageLines(sid, req.GetTenant(), lines, map[int64]bool{})
		return out, nil
	})
}

// usageLines are the lines the session may see, of tenant if it is not
// empty, as the API gives them; visible remembers which tenants it sees.
func (s *Server) usageLines(sid engine.SessionID, tenant string, lines []usage.Line, visible map[int64]bool) []*governorpb.UsageLine {
	var out []*governorpb.UsageLine
	for _, l := range lines {
		seen, known := visible[l.Tenant]
		if !known {
			// A tenant's session sees its own tenant only; the root's
			// own line (tenant 0) only the admin.
			id := l.Tenant
			if id == 0 {
				id = int64(engine.RootID)
			}
			_, err := s.eng.Get(sid, engine.NodeID(id))
			seen = err == nil
			visible[l.Tenant] = seen
		}
		if !seen || (tenant != "" && l.TenantName != tenant) {
			continue
		}
		pl := &governorpb.UsageLine{TenantId: l.Tenant, TaskId: l.Task, Tenant: l.TenantName, Task: l.TaskName,
			Spend: l.Spend, Peak: l.Peak, Denied: l.Denied, LeaseSeconds: map[string]float64{}}
		for c, ns := range l.SlotNanos {
			pl.LeaseSeconds[c] = float64(ns) / 1e9
		}
		out = append(out, pl)
	}
	return out
}

// usagePer reports [from, to) one bucket of req.Per at a time, a line
// per tenant (and the root's, for the admin) in each.
func (s *Server) usagePer(ctx context.Context, req *governorpb.GetUsageRequest, from, to, now time.Time) (*governorpb.UsageReport, error) {
	unit, err := usage.ParseUnit(req.GetPer())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "per: %v", err)
	}
	rs, ok := s.st.(store.RollupStore)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this store keeps no usage rollups")
	}
	first, last := usage.MinuteOf(from.UnixNano()), usage.MinuteOf(to.UnixNano()-1)+1
	if n := (last - first) / map[usage.Unit]int64{usage.Hour: 60, usage.Day: 23 * 60, usage.Month: 28 * 24 * 60}[unit]; n > maxUsageBuckets {
		return nil, status.Errorf(codes.InvalidArgument, "the window holds more than %d buckets of a %s; ask for a shorter one", maxUsageBuckets, unit)
	}
	buckets := usage.Buckets(unit, first, last, s.location())
	if len(buckets) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "the window from %v to %v holds no %s", from, to, unit)
	}
	for i := range buckets {
		buckets[i].Now = now.UnixNano()
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.UsageReport, error) {
		if err := s.durable(ctx); err != nil {
			return nil, err
		}
		lines, err := s.bucketLines(ctx, rs, unit, buckets)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "read usage: %v", err)
		}
		out := &governorpb.UsageReport{From: timestamppb.New(time.Unix(buckets[0].From*60, 0)),
			To: timestamppb.New(time.Unix(buckets[len(buckets)-1].To*60, 0))}
		visible := map[int64]bool{}
		for i, b := range buckets {
			for _, pl := range s.usageLines(sid, req.GetTenant(), lines[i], visible) {
				if pl.GetTaskId() != 0 {
					continue // tenants only (rollupRows)
				}
				pl.Start, pl.End = timestamppb.New(time.Unix(b.From*60, 0)), timestamppb.New(time.Unix(b.To*60, 0))
				out.Lines = append(out.Lines, pl)
			}
		}
		return out, nil
	})
}
