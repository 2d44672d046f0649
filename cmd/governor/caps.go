package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/cli/slots"
	"github.com/governor-project/governor/cli/tenantstate"
)

const capsUsage = `usage:
  governor caps get NODE [-json]
  governor caps set NODE KEY=VALUE... -reason "why" [-for 2h]
  governor caps history NODE [-json]

NODE is an id (7) or a path from the root (payments/checkout-42).
KEY is quota.RESOURCE, limit.CLASS, default_quota.RESOURCE,
default_limit.CLASS, rate.RESOURCE, default_rate.RESOURCE, weight or
priority; VALUE "none" (or -1) removes a cap. A rate is N/PERIOD (100/s,
40000/min; PERIOD ms, s, min, h, day or a duration) with an optional
:burst=B, the bucket's size (default N), e.g. rate.tokens=40000/min:burst=80000.
A quota or limit may add how it is enforced: VALUE:hard (the default),
VALUE:soft:burst=N (work may go N past the cap, with a warning, then it is
refused; N > 0) or VALUE:warn_only (never refused; would-be denials are recorded),
e.g. quota.tokens=50000:soft:burst=5000. period.RESOURCE=P makes a quota
reset at each boundary of P: hour, day, week (from Monday), month (in
governord's time_zone) or a duration from 1s to 366 days such as 10s; none
removes it (default_period.RESOURCE for the default quotas). min.CLASS=N sets a tenant's
reserved minimum of a pool class (0 removes it).
-for makes the change a temporary override that governord reverts by itself.
Every change is kept in the node's audit trail: who, when, why, old and new.
`

func caps(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, capsUsage)
		return 2
	}
	fs := flag.NewFlagSet("governor caps "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, capsUsage); fs.PrintDefaults() }
	asJSON := fs.Bool("json", false, "print JSON")
	reason := fs.String("reason", "", "set: why the change is made (required; kept in the audit trail)")
	forDur := fs.Duration("for", 0, "set: make the change a temporary override that reverts after this long")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return 2
	}
	var run func(ctx context.Context, rpc governorpb.GovernorClient, node *governorpb.Node) error
	switch args[0] {
	case "get":
		if len(pos) != 1 {
			break
		}
		run = func(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node) error {
			return capsGet(ctx, rpc, n, *asJSON, stdout)
		}
	case "history":
		if len(pos) != 1 {
			break
		}
		run = func(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node) error {
			return capsHistory(ctx, rpc, n, *asJSON, stdout)
		}
	case "set":
		if len(pos) < 2 {
			break
		}
		req, err := parseCapEdits(pos[1:])
		if err == nil && strings.TrimSpace(*reason) == "" {
			err = fmt.Errorf("-reason is required: say why, it is kept in the audit trail")
		}
		if err == nil && flagSet(fs, "for") && *forDur <= 0 {
			// 0 would make a permanent change that reads as a temporary one.
			err = fmt.Errorf("-for %v: an override lasts a positive duration; leave -for out for a permanent change", *forDur)
		}
		if err != nil {
			fmt.Fprintln(stderr, "governor caps set:", err)
			return 2
		}
		req.Reason = *reason
		if *forDur > 0 {
			req.OverrideFor = durationpb.New(*forDur)
		}
		run = func(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node) error {
			return capsSet(ctx, rpc, n, req, stdout)
		}
	default:
		fmt.Fprintf(stderr, "governor caps: unknown subcommand %q\n\n%s", args[0], capsUsage)
		return 2
	}
	if run == nil {
		fs.Usage()
		return 2
	}
	ctx := context.Background()
	c, err := connect(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "governor caps:", err)
		return 1
	}
	defer c.Close()
	n, err := resolve(ctx, c.Raw(), pos[0])
	if err == nil {
		err = run(ctx, c.Raw(), n)
	}
	if err != nil {
		fmt.Fprintln(stderr, "governor caps:", err)
		return 1
	}
	return 0
}

// parseCapEdits reads KEY=VALUE arguments into a SetCaps request.
func parseCapEdits(args []string) (*governorpb.SetCapsRequest, error) {
	req := &governorpb.SetCapsRequest{}
	put := func(m *map[string]int64, key string, v int64) {
		if *m == nil {
			*m = make(map[string]int64)
		}
		(*m)[key] = v
	}
	for _, a := range args {
		key, val, ok := strings.Cut(a, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not KEY=VALUE", a)
		}
		if kind, name, _ := strings.Cut(key, "."); kind == "period" || kind == "default_period" {
			if err := putPeriod(req, kind, name, val); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			continue
		}
		if kind, name, _ := strings.Cut(key, "."); kind == "rate" || kind == "default_rate" {
			if err := putRate(req, kind, name, val); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			continue
		}
		val, modeText, withMode := strings.Cut(val, ":")
		var v int64 = -1
		if val != "none" {
			var err error
			if v, err = strconv.ParseInt(val, 10, 64); err != nil || v < -1 {
				return nil, fmt.Errorf("%s: %q is not a whole number >= 0, or none", key, val)
			}
		}
		kind, name, _ := strings.Cut(key, ".")
		if (kind == "weight" || kind == "priority") != (name == "") {
			return nil, fmt.Errorf("%q: want quota.NAME, limit.NAME, default_quota.NAME, default_limit.NAME, weight or priority", key)
		}
		if withMode {
			mode, err := parseCapMode(key, kind, modeText, v)
			if err != nil {
				return nil, err
			}
			if kind == "quota" {
				putMode(&req.QuotaModes, name, mode)
			} else {
				putMode(&req.LimitModes, name, mode)
			}
		}
		switch kind {
		case "min":
			if v < 0 {
				return nil, fmt.Errorf("%s: a minimum is a whole number >= 0 (0 removes it)", key)
			}
			if req.Minimums == nil {
				req.Minimums = map[string]*governorpb.Minimum{}
			}
			req.Minimums[name] = &governorpb.Minimum{Min: v}
		case "quota":
			put(&req.Quotas, name, v)
		case "limit":
			put(&req.Limits, name, v)
		case "default_quota":
			put(&req.DefaultQuotas, name, v)
		case "default_limit":
			put(&req.DefaultLimits, name, v)
		case "weight":
			req.Weight = &v
		case "priority":
			req.Priority = &v
		default:
			return nil, fmt.Errorf("%q: want quota.NAME, limit.NAME, default_quota.NAME, default_limit.NAME, weight or priority", key)
		}
	}
	return req, nil
}

// parseCapMode reads the MODE[:burst=N] after a quota's or limit's value.
func parseCapMode(key, kind, text string, v int64) (*governorpb.CapMode, error) {
	if kind != "quota" && kind != "limit" {
		return nil, fmt.Errorf("%s: only a quota or a limit takes a mode", key)
	}
	if v < 0 {
		return nil, fmt.Errorf("%s: a removed cap takes no mode", key)
	}
	name, rest, hasBurst := strings.Cut(text, ":")
	m := &governorpb.CapMode{Mode: name}
	switch name {
	case "hard", "soft", "warn_only":
	default:
		return nil, fmt.Errorf("%s: mode %q is not hard, soft or warn_only", key, name)
	}
	if hasBurst {
		b, ok := strings.CutPrefix(rest, "burst=")
		n, err := strconv.ParseInt(b, 10, 64)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("%s: %q is not burst=N with N a whole number >= 0", key, rest)
		}
		if name != "soft" {
			return nil, fmt.Errorf("%s: a burst applies only to a soft cap", key)
		}
		m.Burst = n
	}
	if name == "soft" && m.Burst == 0 {
		// governord takes it, and it refuses at the cap as hard does: a
		// rollout meant to let work past the cap would not.
		return nil, fmt.Errorf("%s: a soft cap needs a burst, soft:burst=N with N > 0 (work may go N past the cap); without one it refuses at the cap, as hard does", key)
	}
	return m, nil
}

func putMode(m *map[string]*governorpb.CapMode, key string, v *governorpb.CapMode) {
	if *m == nil {
		*m = make(map[string]*governorpb.CapMode)
	}
	(*m)[key] = v
}

// capView is what caps get prints, also as JSON.
type capView struct {
	ID    int64  `json:"id"`
	Path  string `json:"path"`
	Kind  string `json:"kind"`
	State string `json:"state"`
	// What decides how a contended pool is shared: a tenant's weight in
	// the fair queue across tenants and its reserved minimums, and the
	// node's priority within its tenant.
	Weight   int64         `json:"weight,omitempty"`
	Priority int64         `json:"priority"`
	Minimums []minimumLine `json:"minimums,omitempty"`
	// Defaults are the caps each child created under the node later gets.
	Defaults defaultCaps `json:"defaults"`
	// TenantState is the state of the node's tenant (the node itself, or
	// the tenant above it): what it refuses, why, who set it and since
	// when. Absent above the tenants, and for a key that cannot see it.
	TenantState *tenantState `json:"tenant_state,omitempty"`
	Quotas      []capLine    `json:"quotas"`
	Limits      []capLine    `json:"limits"`
	// Rates are the node's own rates, with how full each bucket is now.
	Rates []rateLine `json:"rates,omitempty"`
	// Periods are the node's quotas that reset, with when each next does.
	Periods   []periodLine `json:"periods,omitempty"`
	Effective []effective  `json:"effective"`
}

// periodLine is one of a node's quotas with a period, and its next reset.
type periodLine struct {
	Name    string    `json:"name"`
	Period  string    `json:"period"`
	ResetAt time.Time `json:"reset_at,omitzero"`
}

// rateLine is one of a node's rates: Rate ("100/s") with a bucket of Size,
// which holds Level units now and is full again in FullIn. Slices live
// slices lent to sidecars hold Lent units of the size and LentRate of the
// refill until their terms end.
type rateLine struct {
	Name     string        `json:"name"`
	Rate     string        `json:"rate"`
	Size     int64         `json:"size"`
	Level    int64         `json:"level"`
	FullIn   time.Duration `json:"full_in_ns,omitempty"`
	Slices   int32         `json:"slices,omitempty"`
	Lent     int64         `json:"lent,omitempty"`
	LentRate string        `json:"lent_rate,omitempty"`
}

// lentText says what a rate's slices hold, "" when none lives.
func lentText(slices int32, lent int64, lentRate string) string {
	if slices == 0 {
		return ""
	}
	plural := "s"
	if slices == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d and %s lent to %d slice%s", lent, lentRate, slices, plural)
}

// tenantState is a tenant's state, and which tenant it is.
type tenantState struct {
	Tenant string `json:"tenant"`
	tenantstate.State
}

type minimumLine struct {
	Class string     `json:"class"`
	Min   int64      `json:"min"`
	From  *time.Time `json:"valid_from,omitempty"`
	Until *time.Time `json:"valid_until,omitempty"`
}

type defaultCaps struct {
	Quotas map[string]int64 `json:"quotas"`
	Limits map[string]int64 `json:"limits"`
}

type capLine struct {
	Name     string `json:"name"`
	Used     int64  `json:"used"`
	Reserved int64  `json:"reserved,omitempty"`
	// Shadow is what rules in dry run would have charged (the shadow
	// ledger; docs/policy.md): a record, not usage.
	Shadow int64  `json:"shadow,omitempty"`
	Cap    *int64 `json:"cap,omitempty"`
	// Mode is how the cap is enforced when it is not hard: "soft (burst
	// N)" or "warn_only".
	Mode string `json:"mode,omitempty"`
	// Held is how a limit's held slots are held: leases, and slots
	// delegated to sidecars, in use there or idle.
	Held *slots.Tally `json:"held,omitempty"`
}

// effective is how much more a resource or class admits at the node: the
// least room left on any cap from the node up to the root (as far as the
// session sees), and where that cap is.
type effective struct {
	Kind string `json:"kind"` // quota or limit
	Name string `json:"name"`
	Room int64  `json:"room"`
	At   string `json:"at"`
	Used int64  `json:"used"`
	Cap  int64  `json:"cap"`
}

func capsGet(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node, asJSON bool, out io.Writer) error {
	v, chain, err := capsView(ctx, rpc, n)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return printCapsView(out, v, n, chain)
}

// capsView reads what caps get shows of n: its caps and use, how its
// slots are held, its periods and rates, the tightest caps up its chain,
// its tenant's minimums and state; and the chain it read them from.
func capsView(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node) (capView, []*governorpb.Node, error) {
	path, chain := pathOf(ctx, rpc, n)
	v := capView{ID: n.GetId(), Path: path, Kind: kindName(n.GetKind()), State: stateName(n.GetState())}
	v.Quotas = capLines(n.GetQuotas(), n.GetUsed(), n.GetReserved(), n.GetShadow(), n.GetQuotaModes())
	v.Limits = capLines(n.GetLimits(), n.GetHeld(), nil, nil, n.GetLimitModes())
	if err := heldBy(ctx, rpc, n, v.Limits); err != nil {
		return v, nil, err
	}
	if err := periodsOf(ctx, rpc, n, &v); err != nil {
		return v, nil, err
	}
	if err := ratesOf(ctx, rpc, n, &v); err != nil {
		return v, nil, err
	}
	v.Effective = tightest(chain)
	v.Priority = n.GetPriority()
	v.Defaults = defaultCaps{Quotas: orEmpty(n.GetDefaultQuotas()), Limits: orEmpty(n.GetDefaultLimits())}
	if n.GetKind() == governorpb.NodeKind_NODE_KIND_TENANT {
		v.Weight = n.GetWeight()
		v.Minimums = minimumLines(n.GetMinimums())
	}
	for _, a := range chain {
		st, ok, err := tenantstate.Of(ctx, rpc, a)
		if err != nil {
			return v, nil, err
		}
		if ok {
			v.TenantState = &tenantState{Tenant: a.GetName(), State: st}
		}
	}
	return v, chain, nil
}

// capLines is one line per cap or use: a quota's or a limit's.
func capLines(caps, used, reserved, shadow map[string]int64, modes map[string]*governorpb.CapMode) []capLine {
	var out []capLine
	for _, k := range slices.Sorted(maps.Keys(union(union(caps, used), shadow))) {
		l := capLine{Name: k, Used: used[k], Reserved: reserved[k], Shadow: shadow[k]}
		if c, ok := caps[k]; ok {
			l.Cap = &c
		}
		if m := modes[k]; m != nil && modeText(m) != "hard" {
			l.Mode = modeText(m)
		}
		out = append(out, l)
	}
	return out
}

// ratesOf reads n's own rates with how full each bucket is now.
func ratesOf(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node, v *capView) error {
	if len(n.GetRates()) == 0 {
		return nil
	}
	rep, err := rpc.GetCapStatus(ctx, &governorpb.GetCapStatusRequest{NodeId: n.GetId()})
	if err != nil {
		return fmt.Errorf("the rates of %q: %w", n.GetName(), plainStatus(err))
	}
	for _, r := range rep.GetRates() {
		if r.GetNodeId() == n.GetId() {
			line := rateLine{Name: r.GetName(), Rate: governorpb.FormatRate(r.GetRate().GetUnits(),
				r.GetRate().GetPer().AsDuration()), Size: r.GetSize(), Level: r.GetLevel(), FullIn: r.GetFullIn().AsDuration()}
			if r.GetSlices() > 0 {
				line.Slices, line.Lent = r.GetSlices(), r.GetLent()
				line.LentRate = governorpb.FormatRate(r.GetLentUnits(), r.GetRate().GetPer().AsDuration())
			}
			v.Rates = append(v.Rates, line)
		}
	}
	return nil
}

// minimumLines is a tenant's reserved minimums, by class.
func minimumLines(mins map[string]*governorpb.Minimum) []minimumLine {
	var out []minimumLine
	for _, class := range slices.Sorted(maps.Keys(mins)) {
		m := mins[class]
		ml := minimumLine{Class: class, Min: m.GetMin()}
		if m.GetValidFrom() != nil {
			t := m.GetValidFrom().AsTime()
			ml.From = &t
		}
		if m.GetValidUntil() != nil {
			t := m.GetValidUntil().AsTime()
			ml.Until = &t
		}
		out = append(out, ml)
	}
	return out
}

// printCapsView writes caps get's text: the node, its tenant's state, what
// it shares, then a section each for quotas, limits, periods, rates and
// the effective caps.
func printCapsView(out io.Writer, v capView, n *governorpb.Node, chain []*governorpb.Node) error {
	fmt.Fprintf(out, "%s  (id %d, %s, %s)\n", v.Path, v.ID, v.Kind, v.State)
	if ts := v.TenantState; ts != nil {
		if n.GetKind() == governorpb.NodeKind_NODE_KIND_TENANT {
			fmt.Fprintf(out, "state: %s\n", ts.Text(time.Now()))
		} else if ts.State.State != tenantstate.Active {
			fmt.Fprintf(out, "tenant %s: %s\n", ts.Tenant, ts.Text(time.Now()))
		}
	}
	printSharing(out, v, n.GetKind() == governorpb.NodeKind_NODE_KIND_TENANT)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	printCapSection(tw, "quotas (used/cap):", v.Quotas)
	printCapSection(tw, "limits (held/limit):", v.Limits)
	printPeriods(tw, v.Periods)
	if len(v.Rates) > 0 {
		fmt.Fprintf(tw, "rates (left/burst):\n")
		for _, r := range v.Rates {
			full := "full"
			if r.FullIn > 0 {
				full = "full in " + r.FullIn.Round(time.Millisecond).String()
			}
			if lent := lentText(r.Slices, r.Lent, r.LentRate); lent != "" {
				full += ", " + lent
			}
			fmt.Fprintf(tw, "  %s\t%d/%d\t%s\t%s\n", r.Name, r.Level, r.Size, r.Rate, full)
		}
	}
	fmt.Fprintf(tw, "effective (the tightest cap from here to the root):\n")
	if len(v.Effective) == 0 {
		fmt.Fprintf(tw, "  (no caps)\n")
	}
	for _, e := range v.Effective {
		word := "left"
		if e.Kind == "limit" {
			word = "free"
		}
		fmt.Fprintf(tw, "  %s %s\t%d %s\tat %s (%d/%d)\n", e.Kind, e.Name, e.Room, word, e.At, e.Used, e.Cap)
	}
	if top := chain[len(chain)-1]; top.GetParentId() != 0 {
		fmt.Fprintf(tw, "  (caps above %s are outside this key's scope)\n", top.GetName())
	}
	return tw.Flush()
}

// printCapSection writes one section of caps: each line's use of its cap,
// with a bar, and what is reserved, the mode, the shadow ledger and how its
// slots are held.
func printCapSection(tw io.Writer, title string, ls []capLine) {
	fmt.Fprintf(tw, "%s\n", title)
	if len(ls) == 0 {
		fmt.Fprintf(tw, "  (none)\n")
	}
	for _, l := range ls {
		capText, bar := "no cap", ""
		if l.Cap != nil {
			capText, bar = strconv.FormatInt(*l.Cap, 10), meter(l.Used+l.Reserved, *l.Cap, 20)
		}
		extra := ""
		if l.Reserved != 0 {
			extra = fmt.Sprintf("reserved %d", l.Reserved)
		}
		if l.Mode != "" {
			extra = strings.TrimSpace(extra + " " + l.Mode)
		}
		if l.Shadow != 0 {
			extra = strings.TrimSpace(fmt.Sprintf("%s shadow %d", extra, l.Shadow))
		}
		if l.Held != nil {
			extra = strings.TrimSpace(extra + " " + l.Held.Text())
		}
		fmt.Fprintf(tw, "  %s\t%d/%s\t%s\t%s\n", l.Name, l.Used, capText, bar, extra)
	}
}

// heldBy says, for each limit line with slots held, how they are held:
// leases, or slots delegated to sidecars, in use there or idle (one
// Inspect of the node's subtree, when anything is held).
func heldBy(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node, limits []capLine) error {
	if len(n.GetHeld()) == 0 {
		return nil
	}
	in, err := rpc.Inspect(ctx, &governorpb.InspectRequest{NodeId: n.GetId()})
	if err != nil {
		return fmt.Errorf("the leases of %q: %w", n.GetName(), plainStatus(err))
	}
	for i := range limits {
		if limits[i].Used == 0 {
			continue
		}
		t := &slots.Tally{}
		for _, l := range in.GetLeases() {
			if l.GetClass() == limits[i].Name {
				t.Add(l)
			}
		}
		limits[i].Held = t
	}
	return nil
}

// printSharing prints what decides how a contended pool is shared and what
// the node's new children get: a tenant's weight and minimums, the
// priority, the defaults.
func printSharing(out io.Writer, v capView, tenant bool) {
	if tenant {
		fmt.Fprintf(out, "sharing: weight %d, priority %d\n", v.Weight, v.Priority)
		var mins []string
		for _, m := range v.Minimums {
			s := fmt.Sprintf("%s %d", m.Class, m.Min)
			var when []string
			if m.From != nil {
				when = append(when, "from "+m.From.UTC().Format(time.DateTime))
			}
			if m.Until != nil {
				when = append(when, "until "+m.Until.UTC().Format(time.DateTime))
			}
			if len(when) > 0 {
				s += " (" + strings.Join(when, " ") + " UTC)"
			}
			mins = append(mins, s)
		}
		fmt.Fprintf(out, "minimums: %s\n", cmp.Or(strings.Join(mins, ", "), "none"))
	} else {
		fmt.Fprintf(out, "sharing: priority %d\n", v.Priority)
	}
	var defs []string
	for _, side := range []struct {
		kind string
		caps map[string]int64
	}{{"quota", v.Defaults.Quotas}, {"limit", v.Defaults.Limits}} {
		for _, k := range slices.Sorted(maps.Keys(side.caps)) {
			defs = append(defs, fmt.Sprintf("%s %s=%d", side.kind, k, side.caps[k]))
		}
	}
	fmt.Fprintf(out, "defaults for new children: %s\n", cmp.Or(strings.Join(defs, ", "), "none"))
}

// tightest finds, for every resource and class capped anywhere on chain
// (the node first, then its ancestors), the cap with the least room left.
func tightest(chain []*governorpb.Node) []effective {
	best := map[[2]string]effective{}
	names := make([]string, len(chain))
	for i := range chain {
		var parts []string
		for _, a := range slices.Backward(chain[i:]) {
			if a.GetParentId() != 0 {
				parts = append(parts, a.GetName())
			}
		}
		names[i] = strings.Join(parts, "/")
		if names[i] == "" {
			names[i] = "root"
		}
	}
	for i, a := range chain {
		consider := func(kind string, caps, used, reserved map[string]int64) {
			for k, c := range caps {
				u := used[k] + reserved[k]
				room := max(0, c-u)
				key := [2]string{kind, k}
				if b, ok := best[key]; !ok || room < b.Room {
					best[key] = effective{Kind: kind, Name: k, Room: room, At: names[i], Used: u, Cap: c}
				}
			}
		}
		consider("quota", a.GetQuotas(), a.GetUsed(), a.GetReserved())
		consider("limit", a.GetLimits(), a.GetHeld(), nil)
	}
	out := slices.Collect(maps.Values(best))
	slices.SortFunc(out, func(a, b effective) int {
		return strings.Compare(a.Kind+"\x00"+a.Name, b.Kind+"\x00"+b.Name)
	})
	return out
}

func capsSet(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node, req *governorpb.SetCapsRequest, out io.Writer) error {
	req.NodeId, req.RequestId = n.GetId(), newRequestID()
	after, err := rpc.SetCaps(ctx, req)
	if err != nil {
		return fmt.Errorf("set caps on %q: %w", n.GetName(), plainStatus(err))
	}
	for _, c := range changeLines(capsOf(n, req), capsOf(after, req)) {
		fmt.Fprintf(out, "%s\n", c)
	}
	for _, c := range rateChanges(n, after, req) {
		fmt.Fprintf(out, "%s\n", c)
	}
	for _, c := range periodChanges(n, after, req) {
		fmt.Fprintf(out, "%s\n", c)
	}
	if d := req.GetOverrideFor(); d != nil {
		fmt.Fprintf(out, "temporary: reverts by itself in %v (see governor caps history %d)\n", d.AsDuration(), n.GetId())
	}
	return nil
}

// capsOf picks out of n the values of the keys req names, -1 for none.
func capsOf(n *governorpb.Node, req *governorpb.SetCapsRequest) *governorpb.CapsValues {
	pick := func(named, have map[string]int64) map[string]int64 {
		if len(named) == 0 {
			return nil
		}
		out := map[string]int64{}
		for k := range named {
			v, ok := have[k]
			if !ok {
				v = -1
			}
			out[k] = v
		}
		return out
	}
	v := &governorpb.CapsValues{Quotas: pick(req.GetQuotas(), n.GetQuotas()), Limits: pick(req.GetLimits(), n.GetLimits()),
		DefaultQuotas: pick(req.GetDefaultQuotas(), n.GetDefaultQuotas()), DefaultLimits: pick(req.GetDefaultLimits(), n.GetDefaultLimits())}
	pickModes := func(named, have map[string]*governorpb.CapMode) map[string]*governorpb.CapMode {
		if len(named) == 0 {
			return nil
		}
		out := map[string]*governorpb.CapMode{}
		for k := range named {
			out[k] = have[k] // nil: hard
		}
		return out
	}
	v.QuotaModes, v.LimitModes = pickModes(req.GetQuotaModes(), n.GetQuotaModes()), pickModes(req.GetLimitModes(), n.GetLimitModes())
	if len(req.GetMinimums()) > 0 {
		v.Minimums = map[string]*governorpb.Minimum{}
		for k := range req.GetMinimums() {
			v.Minimums[k] = &governorpb.Minimum{Min: n.GetMinimums()[k].GetMin()}
		}
	}
	if req.Weight != nil {
		w := n.GetWeight()
		v.Weight = &w
	}
	if req.Priority != nil {
		p := n.GetPriority()
		v.Priority = &p
	}
	return v
}

// changeLines says what changed, one "key: old -> new" per key.
func changeLines(old, new *governorpb.CapsValues) []string {
	var out []string
	for _, m := range []struct {
		prefix   string
		old, new map[string]int64
	}{{"quota.", old.GetQuotas(), new.GetQuotas()}, {"limit.", old.GetLimits(), new.GetLimits()},
		{"default_quota.", old.GetDefaultQuotas(), new.GetDefaultQuotas()}, {"default_limit.", old.GetDefaultLimits(), new.GetDefaultLimits()}} {
		for _, k := range slices.Sorted(maps.Keys(m.new)) {
			o, ok := m.old[k]
			if !ok {
				o = -1
			}
			out = append(out, fmt.Sprintf("%s%s: %s -> %s", m.prefix, k, capText(o), capText(m.new[k])))
		}
	}
	for _, m := range []struct {
		prefix   string
		old, new map[string]*governorpb.CapMode
	}{{"quota.", old.GetQuotaModes(), new.GetQuotaModes()}, {"limit.", old.GetLimitModes(), new.GetLimitModes()}} {
		for _, k := range slices.Sorted(maps.Keys(m.new)) {
			out = append(out, fmt.Sprintf("%s%s mode: %s -> %s", m.prefix, k, modeText(m.old[k]), modeText(m.new[k])))
		}
	}
	for _, m := range []struct {
		prefix   string
		old, new map[string]*governorpb.Rate
	}{{"rate.", old.GetRates(), new.GetRates()}, {"default_rate.", old.GetDefaultRates(), new.GetDefaultRates()}} {
		for _, k := range slices.Sorted(maps.Keys(m.new)) {
			out = append(out, fmt.Sprintf("%s%s: %s -> %s", m.prefix, k, rateText(m.old[k]), rateText(m.new[k])))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(new.GetMinimums())) {
		out = append(out, fmt.Sprintf("min.%s: %d -> %d", k, old.GetMinimums()[k].GetMin(), new.GetMinimums()[k].GetMin()))
	}
	if new.Weight != nil {
		out = append(out, fmt.Sprintf("weight: %d -> %d", old.GetWeight(), new.GetWeight()))
	}
	if new.Priority != nil {
		out = append(out, fmt.Sprintf("priority: %d -> %d", old.GetPriority(), new.GetPriority()))
	}
	if new.DeadlineUnixNano != nil {
		out = append(out, fmt.Sprintf("deadline: %s -> %s", deadlineText(old.GetDeadlineUnixNano()), deadlineText(new.GetDeadlineUnixNano())))
	}
	return out
}

// historyLines is what one entry of the audit trail changed: caps, or a
// tenant's state (governor tenant).
func historyLines(c *governorpb.CapsChange) []string {
	out := changeLines(c.GetOld(), c.GetNew())
	if c.GetNewState() != "" {
		line := fmt.Sprintf("state: %s -> %s", c.GetOldState(), c.GetNewState())
		if c.GetRevoked() {
			line += " (leases revoked)"
		}
		out = append(out, line)
	}
	return out
}

// modeText is a mode as caps prints it: hard, soft+N, warn_only.
func modeText(m *governorpb.CapMode) string {
	switch m.GetMode() {
	case "", "hard":
		return "hard"
	case "soft":
		return fmt.Sprintf("soft (burst %d)", m.GetBurst())
	}
	return m.GetMode()
}

func capText(v int64) string {
	if v < 0 {
		return "none"
	}
	return strconv.FormatInt(v, 10)
}

func deadlineText(ns int64) string {
	if ns == 0 {
		return "none"
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339)
}

func capsHistory(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node, asJSON bool, out io.Writer) error {
	h, err := rpc.GetCapsHistory(ctx, &governorpb.GetCapsHistoryRequest{NodeId: n.GetId()})
	if err != nil {
		return fmt.Errorf("history of %q: %w", n.GetName(), plainStatus(err))
	}
	if asJSON {
		type entry struct {
			At      time.Time  `json:"at"`
			Who     string     `json:"who"`
			Reason  string     `json:"reason,omitempty"`
			Changes []string   `json:"changes"`
			Until   *time.Time `json:"until,omitempty"`
			Revert  bool       `json:"revert,omitempty"`
			Seq     uint64     `json:"seq"`
		}
		type pending struct {
			Kind    string    `json:"kind"`
			Name    string    `json:"name"`
			Value   int64     `json:"value"`
			Restore int64     `json:"restore"`
			Until   time.Time `json:"until"`
		}
		doc := struct {
			Node    int64     `json:"node"`
			Changes []entry   `json:"changes"`
			Pending []pending `json:"pending"`
		}{Node: n.GetId(), Changes: []entry{}, Pending: []pending{}}
		for _, c := range h.GetChanges() {
			e := entry{At: c.GetAt().AsTime(), Who: c.GetWho(), Reason: c.GetReason(), Changes: historyLines(c),
				Revert: c.GetRevert(), Seq: c.GetSeq()}
			if c.GetUntil() != nil {
				u := c.GetUntil().AsTime()
				e.Until = &u
			}
			doc.Changes = append(doc.Changes, e)
		}
		for _, p := range h.GetPending() {
			doc.Pending = append(doc.Pending, pending{Kind: p.GetKind(), Name: p.GetName(), Value: p.GetValue(),
				Restore: p.GetRestore(), Until: p.GetUntil().AsTime()})
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "WHEN (UTC)\tWHO\tCHANGE\tUNTIL\tREASON\n")
	for _, c := range h.GetChanges() {
		until := ""
		if c.GetUntil() != nil {
			until = c.GetUntil().AsTime().UTC().Format(time.DateTime)
		}
		for i, line := range historyLines(c) {
			if i == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.GetAt().AsTime().UTC().Format(time.DateTime), c.GetWho(), line, until, c.GetReason())
			} else {
				fmt.Fprintf(tw, "\t\t%s\t\t\n", line)
			}
		}
	}
	if len(h.GetChanges()) == 0 {
		fmt.Fprintf(tw, "(no changes recorded)\n")
	}
	for _, p := range h.GetPending() {
		fmt.Fprintf(tw, "pending revert: %s.%s %s -> %s at %s\n", p.GetKind(), p.GetName(), capText(p.GetValue()),
			capText(p.GetRestore()), p.GetUntil().AsTime().UTC().Format(time.DateTime))
	}
	return tw.Flush()
}

func union(a, b map[string]int64) map[string]int64 {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]int64{}
	}
	for k := range b {
		out[k] = 0
	}
	return out
}

// meter draws used/cap as a bar of width cells.
func meter(used, limit int64, width int) string {
	filled := width
	if limit > 0 {
		filled = int(min(used, limit) * int64(width) / limit)
	} else if used == 0 {
		filled = 0
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]"
}

func kindName(k governorpb.NodeKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "NODE_KIND_"))
}

func stateName(s governorpb.NodeState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "NODE_STATE_"))
}

// putRate reads rate.RESOURCE's or default_rate.RESOURCE's value,
// N/PERIOD[:burst=B] or none, into req.
func putRate(req *governorpb.SetCapsRequest, kind, name, val string) error {
	if name == "" {
		return fmt.Errorf("want %s.RESOURCE", kind)
	}
	r := &governorpb.Rate{Units: -1}
	if val != "none" && val != "-1" {
		text, burst, hasBurst := strings.Cut(val, ":")
		units, per, err := governorpb.ParseRate(text)
		if err != nil {
			return err
		}
		r = &governorpb.Rate{Units: units, Per: durationpb.New(per)}
		if hasBurst {
			b, ok := strings.CutPrefix(burst, "burst=")
			n, err := strconv.ParseInt(b, 10, 64)
			if !ok || err != nil || n < 1 || n > governorpb.MaxAmount {
				return fmt.Errorf("%q is not burst=B with B a whole number from 1 to %d", burst, governorpb.MaxAmount)
			}
			r.Burst = n
		}
	}
	m := &req.Rates
	if kind == "default_rate" {
		m = &req.DefaultRates
	}
	if *m == nil {
		*m = map[string]*governorpb.Rate{}
	}
	(*m)[name] = r
	return nil
}

// rateChanges says, for each rate req names, what it was and is:
// "rate.calls: none -> 100/s (burst 200)".
func rateChanges(before, after *governorpb.Node, req *governorpb.SetCapsRequest) []string {
	var out []string
	for _, side := range []struct {
		kind          string
		named, b4, af map[string]*governorpb.Rate
	}{{"rate", req.GetRates(), before.GetRates(), after.GetRates()},
		{"default_rate", req.GetDefaultRates(), before.GetDefaultRates(), after.GetDefaultRates()}} {
		for _, k := range slices.Sorted(maps.Keys(side.named)) {
			out = append(out, fmt.Sprintf("%s.%s: %s -> %s", side.kind, k, rateText(side.b4[k]), rateText(side.af[k])))
		}
	}
	return out
}

// rateText is a rate as caps prints it: "100/s (burst 200)", or "none"
// (no rate, or units -1 in the audit trail).
func rateText(r *governorpb.Rate) string {
	if r == nil || r.GetUnits() < 0 {
		return "none"
	}
	s := governorpb.FormatRate(r.GetUnits(), r.GetPer().AsDuration())
	if r.GetBurst() > 0 {
		s += fmt.Sprintf(" (burst %d)", r.GetBurst())
	}
	return s
}

// putPeriod reads period.RESOURCE's or default_period.RESOURCE's value, a
// period (governorpb.ParsePeriod) or none, into req.
func putPeriod(req *governorpb.SetCapsRequest, kind, name, val string) error {
	if name == "" {
		return fmt.Errorf("want %s.RESOURCE", kind)
	}
	if val == "-1" {
		val = governorpb.NoPeriod
	}
	if _, _, err := governorpb.ParsePeriod(val); err != nil {
		return err
	}
	m := &req.QuotaPeriods
	if kind == "default_period" {
		m = &req.DefaultQuotaPeriods
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[name] = strings.TrimSpace(val)
	return nil
}

// periodChanges says, for each period req names, what it was and is:
// "period.tokens: none -> month".
func periodChanges(before, after *governorpb.Node, req *governorpb.SetCapsRequest) []string {
	text := func(m map[string]string, k string) string {
		if p, ok := m[k]; ok {
			return p
		}
		return governorpb.NoPeriod
	}
	var out []string
	for _, side := range []struct {
		kind          string
		named, b4, af map[string]string
	}{{"period", req.GetQuotaPeriods(), before.GetQuotaPeriods(), after.GetQuotaPeriods()},
		{"default_period", req.GetDefaultQuotaPeriods(), before.GetDefaultQuotaPeriods(), after.GetDefaultQuotaPeriods()}} {
		for _, k := range slices.Sorted(maps.Keys(side.named)) {
			out = append(out, fmt.Sprintf("%s.%s: %s -> %s", side.kind, k, text(side.b4, k), text(side.af, k)))
		}
	}
	return out
}

// periodsOf fills v.Periods with n's own quotas that reset, from
// GetCapStatus; a node without periods asks nothing.
func periodsOf(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node, v *capView) error {
	if len(n.GetQuotaPeriods()) == 0 {
		return nil
	}
	rep, err := rpc.GetCapStatus(ctx, &governorpb.GetCapStatusRequest{NodeId: n.GetId()})
	if err != nil {
		return fmt.Errorf("the periods of %q: %w", n.GetName(), plainStatus(err))
	}
	for _, c := range rep.GetCaps() {
		if c.GetNodeId() == n.GetId() && !c.GetLimit() && c.GetPeriod() != "" {
			pl := periodLine{Name: c.GetName(), Period: c.GetPeriod()}
			if c.GetResetAt() != nil {
				pl.ResetAt = c.GetResetAt().AsTime()
			}
			v.Periods = append(v.Periods, pl)
		}
	}
	return nil
}

// printPeriods writes caps get's periods section, when there are any.
func printPeriods(w io.Writer, periods []periodLine) {
	if len(periods) == 0 {
		return
	}
	fmt.Fprintf(w, "periods (used counts since the last reset):\n")
	for _, p := range periods {
		when := "never"
		if !p.ResetAt.IsZero() {
			when = p.ResetAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "  %s\t%s\tresets at %s\n", p.Name, p.Period, when)
	}
}
