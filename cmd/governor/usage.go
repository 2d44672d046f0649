package main

import (
	"context"
	"encoding/csv"
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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
)

const usageUsage = `usage: governor usage [-since 24h | -from TIME [-to TIME]] [-tenant NAME] [-by tenant|task] [-per hour|day|month] [-format table|csv|json]

What each tenant and task spent (units by resource), held (slot-seconds
and the most slots at once, by lease class) and was refused (by cause),
over a window rounded out to whole minutes. TIME is RFC 3339
(2026-12-01T09:00:00Z). An admin key sees every tenant, a tenant's key its own.
With -per, one line per tenant per hour, day or month that meets the
window (whole ones, on the calendar of governord's time_zone), read from
the rollups governord keeps after the minutes are gone; tasks' lines are
kept only as long as the minutes.

flags:
`

func usageCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor usage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usageUsage); fs.PrintDefaults() }
	since := fs.Duration("since", 24*time.Hour, "the window: this long before now (or before -to)")
	fromFlag := fs.String("from", "", "the window's start (RFC 3339); instead of -since")
	toFlag := fs.String("to", "", "the window's end (RFC 3339); default now")
	tenant := fs.String("tenant", "", "only this tenant")
	by := fs.String("by", "task", "tenant: one line per tenant; task: also one per task")
	format := fs.String("format", "table", "table, csv or json")
	per := fs.String("per", "", "hour, day or month: a line per bucket of time")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "governor usage: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments %q", fs.Args())
	}
	if *by != "tenant" && *by != "task" {
		return bad("-by %q: want tenant or task", *by)
	}
	if *format != "table" && *format != "csv" && *format != "json" {
		return bad("-format %q: want table, csv or json", *format)
	}
	if !slices.Contains([]string{"", "hour", "day", "month"}, *per) {
		return bad("-per %q: want hour, day or month", *per)
	}
	if *per != "" && *by == "task" && flagSet(fs, "by") {
		return bad("-per %s reports tenants only: rollups keep no task's lines; drop -by task, or use -from/-to for tasks", *per)
	}
	from, to, err := usageWindow(*since, *fromFlag, *toFlag)
	if err != nil {
		return bad("%v", err)
	}
	ctx := context.Background()
	c, err := connect(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "governor usage:", err)
		return 1
	}
	defer c.Close()
	rep, err := c.Raw().GetUsage(ctx, &governorpb.GetUsageRequest{From: timestamppb.New(from), To: timestamppb.New(to), Tenant: *tenant, Per: *per})
	if err != nil {
		fmt.Fprintln(stderr, "governor usage:", plainStatus(err))
		return 1
	}
	if *tenant != "" && len(rep.GetLines()) == 0 {
		// An empty report reads the same for a misspelt name as for a
		// quiet tenant: say which it is.
		if err := isTenant(ctx, c.Raw(), *tenant); err != nil {
			fmt.Fprintln(stderr, "governor usage:", err)
			return 1
		}
	}
	var lines []*governorpb.UsageLine
	for _, l := range rep.GetLines() {
		if *by == "task" || l.GetTaskId() == 0 {
			lines = append(lines, l)
		}
	}
	if err := writeUsage(stdout, *format, *per != "", rep, lines); err != nil {
		fmt.Fprintln(stderr, "governor usage:", err)
		return 1
	}
	return 0
}

// usageWindow is the report's window: -from (or -since before the end)
// to -to (or now).
func usageWindow(since time.Duration, fromFlag, toFlag string) (from, to time.Time, err error) {
	to = time.Now()
	if toFlag != "" {
		if to, err = time.Parse(time.RFC3339, toFlag); err != nil {
			return from, to, fmt.Errorf("-to: %w", err)
		}
	}
	if since <= 0 {
		return from, to, fmt.Errorf("-since %v: want a positive duration", since)
	}
	from = to.Add(-since)
	if fromFlag != "" {
		if from, err = time.Parse(time.RFC3339, fromFlag); err != nil {
			return from, to, fmt.Errorf("-from: %w", err)
		}
	}
	if !from.Before(to) {
		return from, to, fmt.Errorf("the window's start %v is not before its end %v", from, to)
	}
	return from, to, nil
}

// writeUsage writes the report's lines in the format asked for; per
// says that each line is a bucket of time, named first.
func writeUsage(w io.Writer, format string, per bool, rep *governorpb.UsageReport, lines []*governorpb.UsageLine) error {
	switch format {
	case "json":
		return usageJSON(w, rep, lines)
	case "csv":
		return usageCSV(w, per, lines)
	}
	return usageTable(w, per, rep, lines)
}

// bucketStart is when a line's bucket starts, as the table shows it (UTC).
func bucketStart(l *governorpb.UsageLine) string {
	return l.GetStart().AsTime().UTC().Format("2006-01-02 15:04")
}

// isTenant says why name is not a tenant the session sees, or nil.
func isTenant(ctx context.Context, rpc governorpb.GovernorClient, name string) error {
	n, err := rpc.GetNode(ctx, &governorpb.GetNodeRequest{Path: name})
	switch {
	case status.Code(err) == codes.NotFound || status.Code(err) == codes.InvalidArgument:
		return fmt.Errorf("-tenant %q: no such tenant (or not one this key can see)", name)
	case err != nil:
		return fmt.Errorf("-tenant %q: %w", name, plainStatus(err))
	case n.GetKind() != governorpb.NodeKind_NODE_KIND_TENANT:
		return fmt.Errorf("-tenant %q: that is a %s, not a tenant", name, kindName(n.GetKind()))
	}
	return nil
}

// usageRow is one line as JSON.
type usageRow struct {
	Tenant       string             `json:"tenant"`
	Task         string             `json:"task,omitempty"`
	TenantID     int64              `json:"tenant_id"`
	TaskID       int64              `json:"task_id,omitempty"`
	Spend        map[string]int64   `json:"spend"`
	LeaseSeconds map[string]float64 `json:"lease_seconds"`
	Peak         map[string]int64   `json:"peak"`
	Denied       map[string]int64   `json:"denied"`
	Start        *time.Time         `json:"start,omitempty"` // with -per: the line's bucket
	End          *time.Time         `json:"end,omitempty"`
}

func usageJSON(out io.Writer, rep *governorpb.UsageReport, lines []*governorpb.UsageLine) error {
	doc := struct {
		From  time.Time  `json:"from"`
		To    time.Time  `json:"to"`
		Lines []usageRow `json:"lines"`
	}{From: rep.GetFrom().AsTime(), To: rep.GetTo().AsTime(), Lines: []usageRow{}}
	for _, l := range lines {
		row := usageRow{Tenant: tenantName(l), Task: l.GetTask(), TenantID: l.GetTenantId(), TaskID: l.GetTaskId(),
			Spend: orEmpty(l.GetSpend()), LeaseSeconds: orEmptyF(l.GetLeaseSeconds()), Peak: orEmpty(l.GetPeak()), Denied: orEmpty(l.GetDenied())}
		if l.GetStart() != nil {
			start, end := l.GetStart().AsTime(), l.GetEnd().AsTime()
			row.Start, row.End = &start, &end
		}
		doc.Lines = append(doc.Lines, row)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// usageCSV writes one row per figure: tenant, task, figure, name, value;
// with per, the bucket's start (RFC 3339) first.
func usageCSV(out io.Writer, per bool, lines []*governorpb.UsageLine) error {
	w := csv.NewWriter(out)
	header := []string{"tenant", "task", "figure", "name", "value"}
	if per {
		header = append([]string{"start"}, header...)
	}
	_ = w.Write(header)
	for _, l := range lines {
		write := func(figure, name, value string) {
			row := []string{tenantName(l), l.GetTask(), figure, name, value}
			if per {
				row = append([]string{l.GetStart().AsTime().UTC().Format(time.RFC3339)}, row...)
			}
			_ = w.Write(row)
		}
		put := func(figure string, m map[string]int64) {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				write(figure, k, strconv.FormatInt(m[k], 10))
			}
		}
		put("spend", l.GetSpend())
		for _, k := range slices.Sorted(maps.Keys(l.GetLeaseSeconds())) {
			write("lease_seconds", k, strconv.FormatFloat(l.GetLeaseSeconds()[k], 'f', 3, 64))
		}
		put("peak", l.GetPeak())
		put("denied", l.GetDenied())
	}
	w.Flush()
	return w.Error()
}

func usageTable(out io.Writer, per bool, rep *governorpb.UsageReport, lines []*governorpb.UsageLine) error {
	fmt.Fprintf(out, "usage from %s to %s (UTC)\n", rep.GetFrom().AsTime().UTC().Format(time.DateTime), rep.GetTo().AsTime().UTC().Format(time.DateTime))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if per {
		fmt.Fprint(tw, "START (UTC)\t")
	}
	fmt.Fprintln(tw, "TENANT\tTASK\tSPEND\tLEASE-SECONDS\tPEAK\tDENIED")
	for _, l := range lines {
		if per {
			fmt.Fprint(tw, bucketStart(l)+"\t")
		}
		task := l.GetTask()
		if l.GetTaskId() == 0 {
			task = "(all)"
		}
		secs := map[string]string{}
		for k, v := range l.GetLeaseSeconds() {
			secs[k] = strconv.FormatFloat(v, 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", tenantName(l), task, pairs(ints(l.GetSpend())), pairs(secs),
			pairs(ints(l.GetPeak())), pairs(ints(l.GetDenied())))
	}
	if len(lines) == 0 {
		fmt.Fprintln(tw, "(no usage in this window)")
	}
	return tw.Flush()
}

func tenantName(l *governorpb.UsageLine) string {
	if l.GetTenantId() == 0 {
		return "(root)"
	}
	return l.GetTenant()
}

func ints(m map[string]int64) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = strconv.FormatInt(v, 10)
	}
	return out
}

func pairs(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, " ")
}

func orEmpty(m map[string]int64) map[string]int64 {
	if m == nil {
		return map[string]int64{}
	}
	return m
}

func orEmptyF(m map[string]float64) map[string]float64 {
	if m == nil {
		return map[string]float64{}
	}
	return m
}
