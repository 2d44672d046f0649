package top

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/cli/tenantstate"
)

// fakeSource records cap edits; the tests feed frames by hand.
type fakeSource struct {
	sets []string
}

func (f *fakeSource) Tree(context.Context) (*governorpb.ListTreeResponse, error) {
	return nil, errors.New("not used")
}

func (f *fakeSource) Inspect(context.Context, int64) (*governorpb.Inspection, error) {
	return nil, errors.New("not used")
}

func (f *fakeSource) TenantState(context.Context, *governorpb.Node) (tenantstate.State, error) {
	return tenantstate.State{}, errors.New("not used")
}

func (f *fakeSource) CapStatus(context.Context, int64) (*governorpb.CapStatusReport, error) {
	return nil, errors.New("not used")
}

func (f *fakeSource) SetCap(_ context.Context, node int64, limit bool, name string, value int64, reason string) error {
	f.sets = append(f.sets, fmt.Sprintf("%d %v %s=%d %q", node, limit, name, value, reason))
	return nil
}

var epoch = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// bigTree is the root, two tenants and tasks/2 tasks under each; task i
// has used i%100 of 100 tokens.
func bigTree(tasks int) *governorpb.ListTreeResponse {
	t := &governorpb.ListTreeResponse{Waiting: map[int64]int32{}}
	t.Nodes = append(t.Nodes, &governorpb.Node{Id: 1, Name: "root", Limits: map[string]int64{"db": 40}, Held: map[string]int64{"db": 3}})
	id := int64(2)
	for _, tenant := range []string{"payments", "search"} {
		tid := id
		id++
		t.Nodes = append(t.Nodes, &governorpb.Node{Id: tid, ParentId: 1, Name: tenant, Quotas: map[string]int64{"tokens": 1_000_000},
			Created: timestamppb.New(epoch.Add(-time.Hour))})
		for i := range tasks / 2 {
			t.Nodes = append(t.Nodes, &governorpb.Node{Id: id, ParentId: tid, Name: fmt.Sprintf("task-%d", i),
				Quotas: map[string]int64{"tokens": 100}, Used: map[string]int64{"tokens": int64(i % 100)},
				Created: timestamppb.New(epoch.Add(-time.Duration(i) * time.Second))})
			id++
		}
	}
	t.Waiting[3] = 2
	return t
}

func newTestModel(t *testing.T, tasks int) (*Model, *fakeSource) {
	t.Helper()
	src := &fakeSource{}
	m := New(src, "127.0.0.1:7600", time.Second)
	m.now = func() time.Time { return epoch }
	m.Update(tea.WindowSizeMsg{Width: 140, Height: 40})
	m.Update(frameMsg{tree: bigTree(tasks), at: epoch, inspect: &governorpb.Inspection{ServerTime: timestamppb.New(epoch),
		LeaseCount: 3, WaiterCount: 2, Seq: 1000, LastCommit: durationpb.New(1500 * time.Microsecond)}})
	return m, src
}

func keys(m *Model, ks ...string) tea.Cmd {
	var last tea.Cmd
	for _, k := range ks {
		var msg tea.KeyMsg
		switch k {
		case "enter":
			msg = tea.KeyMsg{Type: tea.KeyEnter}
		case "esc":
			msg = tea.KeyMsg{Type: tea.KeyEsc}
		case "down":
			msg = tea.KeyMsg{Type: tea.KeyDown}
		case "pgdown":
			msg = tea.KeyMsg{Type: tea.KeyPgDown}
		case " ":
			msg = tea.KeyMsg{Type: tea.KeySpace, Runes: []rune{' '}}
		case "end":
			msg = tea.KeyMsg{Type: tea.KeyEnd}
		default:
			msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		}
		_, last = m.Update(msg)
	}
	return last
}

// 10,000 nodes: the screen draws only the rows that fit, whatever the
// tree's size, and moving through it keeps the selection in view.
func TestViewDrawsOnlyWhatFits(t *testing.T) {
	m, _ := newTestModel(t, 10_000)
	if len(m.rows) != 10_003 {
		t.Fatalf("%d rows, want 10,003", len(m.rows))
	}
	v := m.View()
	if lines := strings.Count(v, "\n") + 1; lines != 40 {
		t.Fatalf("the view is %d lines, want the terminal's 40", lines)
	}
	for _, want := range []string{"nodes 10003", "leases 3", "waiters 2", "commit 1.5ms", "root", "  payments", "    task-0"} {
		if !strings.Contains(v, want) {
			t.Errorf("view lacks %q:\n%s", want, v)
		}
	}
	if strings.Contains(v, "task-200 ") {
		t.Errorf("a row far below the screen is drawn:\n%s", v)
	}
	keys(m, "end")
	v = m.View()
	if !strings.Contains(v, "task-4999") || strings.Contains(v, "task-0 ") {
		t.Errorf("at the end the last task shows and the first does not:\n%s", v)
	}
	if m.selected != m.rows[len(m.rows)-1].node.GetId() {
		t.Errorf("selected %d, want the last row", m.selected)
	}
}

func TestSortFilterAndDetail(t *testing.T) {
	m, _ := newTestModel(t, 10)
	keys(m, "s")
	// Under payments, the fullest task comes first: task-4 (4/100).
	if got := m.rows[2].node.GetName(); got != "task-4" {
		t.Fatalf("sorted by use, the first task is %s, want task-4", got)
	}
	keys(m, "/", "t", "a", "s", "k", "-", "3", "enter")
	var names []string
	for _, r := range m.rows {
		names = append(names, r.path)
	}
	if got := strings.Join(names, ","); got != ",payments,payments/task-3,search,search/task-3" {
		t.Fatalf("filtered to task-3: %s", got)
	}
	keys(m, "/", "esc")
	if len(m.rows) != 13 {
		t.Fatalf("esc clears the filter: %d rows", len(m.rows))
	}
	// The detail panel shows the selected node's leases and denials.
	keys(m, "s", "down", "down")
	sel := m.selected
	m.Update(frameMsg{tree: bigTree(10), at: epoch.Add(time.Second), inspect: &governorpb.Inspection{ServerTime: timestamppb.New(epoch),
		Seq: 1010, LeaseCount: 4, Leases: []*governorpb.LeaseInfo{
			{Id: 70, NodeId: sel, Class: "web", SessionId: 8, Granted: timestamppb.New(epoch.Add(-time.Hour)), Count: 0, Block: true},
			{Id: 71, NodeId: sel, Class: "web", SessionId: 8, Granted: timestamppb.New(epoch.Add(-time.Hour)), Count: 4, Block: true,
				UseReported: timestamppb.New(epoch), InUse: 1, InUseSince: timestamppb.New(epoch.Add(-3 * time.Second))},
			{Id: 72, NodeId: sel, Class: "db", SessionId: 6, Granted: timestamppb.New(epoch.Add(-22 * time.Second)), Count: 2, Block: true},
			{Id: 77, NodeId: sel, Class: "db", SessionId: 9, Granted: timestamppb.New(epoch.Add(-90 * time.Second)), Count: 1}},
		RecentDenials: []*governorpb.RecentDenial{{At: timestamppb.New(epoch.Add(-5 * time.Second)), NodeId: sel, Cause: "quota:tokens"}}}})
	v := m.View()
	for _, want := range []string{"payments/task-0  (id 3)", "held: 1 lease, 6 delegated (1 in use, 3 idle, 2 not reported)",
		// The work held longest first, then by age; a block holding no slots is not listed.
		"  lease 77 of db, session 9: held for 1m30s\n" +
			"  block 72 of db, session 6: 2 slots delegated for 22s; how many are in use is not reported\n" +
			"  block 71 of web, session 8: 4 slots delegated; 1 in use (for 3s), 3 idle\n",
		"5s ago  quota:tokens", "events 10.0/s", "tokens 0/100"} {
		if !strings.Contains(v, want) {
			t.Errorf("view lacks %q:\n%s", want, v)
		}
	}
	if strings.Contains(v, "block 70") {
		t.Errorf("a block of no slots is listed:\n%s", v)
	}
}

// The detail panel shows the rates on the selected node's chain as the
// cap status reads them: each bucket's units left of its burst, the rate,
// how long until it is full, and the node of an ancestor's rate; nothing
// when the node has none.
func TestDetailShowsRates(t *testing.T) {
	m, _ := newTestModel(t, 10)
	keys(m, "down", "down") // payments/task-0
	sel := m.selected
	frame := func(caps *governorpb.CapStatusReport) string {
		m.Update(frameMsg{tree: bigTree(10), at: epoch.Add(time.Second), caps: caps,
			inspect: &governorpb.Inspection{ServerTime: timestamppb.New(epoch), Seq: 1000}})
		return m.View()
	}
	v := frame(&governorpb.CapStatusReport{Rates: []*governorpb.RateStatus{
		{NodeId: sel, NodeName: "task-0", Name: "calls", Rate: &governorpb.Rate{Units: 2, Per: durationpb.New(time.Hour)},
			Size: 3, Level: 1, FullIn: durationpb.New(40 * time.Minute)},
		{NodeId: 2, NodeName: "payments", Name: "requests", Rate: &governorpb.Rate{Units: 100, Per: durationpb.New(time.Second)},
			Size: 100, Level: 60, FullIn: durationpb.New(4 * time.Second), Slices: 2, Lent: 40, LentUnits: 40}}})
	want := "rates (left/burst): calls 1/3 (2/h, full in 40m00s)  requests 60/100 (100/s, full in 4s, 40 lent) on payments"
	if !strings.Contains(v, want) {
		t.Errorf("view lacks %q:\n%s", want, v)
	}
	if v := frame(&governorpb.CapStatusReport{}); strings.Contains(v, "rates (left/burst)") {
		t.Errorf("a node without rates shows a rates line:\n%s", v)
	}
}

// A cap is edited with a reason and a confirmation, through the source's
// audited path; a bad entry or no reason changes nothing.
func TestEditCap(t *testing.T) {
	m, src := newTestModel(t, 10)
	keys(m, "down", "down") // payments/task-0
	keys(m, "e", "q", "u", "o", "t", "a", "=", "1", "enter")
	if m.mode != modeEditCap || !strings.Contains(m.status, "quota.NAME=N") {
		t.Fatalf("a bad entry: mode %d, status %q", m.mode, m.status)
	}
	m.input = ""
	keys(m, "quota.tokens=777", "enter", "enter")
	if m.mode != modeEditReason || !strings.Contains(m.status, "reason is required") {
		t.Fatalf("no reason: mode %d, status %q", m.mode, m.status)
	}
	keys(m, "incident", " ", "9", "enter")
	if !strings.Contains(m.View(), `set quota.tokens on payments/task-0: 100 -> 777, because "incident 9"? [y/n]`) {
		t.Fatalf("the confirmation:\n%s", m.View())
	}
	cmd := keys(m, "y")
	msg := cmd()
	m.Update(msg)
	if len(src.sets) != 1 || src.sets[0] != `3 false tokens=777 "incident 9"` {
		t.Fatalf("cap edits sent: %v", src.sets)
	}
	if !strings.Contains(m.View(), `quota.tokens on payments/task-0: 100 -> 777 (audited: "incident 9")`) {
		t.Fatalf("after the edit:\n%s", m.View())
	}
	keys(m, "e", "limit.db=none", "enter", "why", "enter", "n")
	if len(src.sets) != 1 || m.status != "not changed" {
		t.Fatalf("n at the confirmation sent %v, status %q", src.sets, m.status)
	}
}

// When governord cannot be reached the screen says so and keeps the last
// data; the next frame that arrives clears it.
func TestUnreachableBanner(t *testing.T) {
	m, _ := newTestModel(t, 10)
	m.now = func() time.Time { return epoch.Add(3 * time.Second) }
	m.Update(frameMsg{err: errors.New("connection refused"), at: epoch.Add(3 * time.Second)})
	v := m.View()
	if !strings.Contains(v, "governord unreachable — retrying every 1s; showing data from 3s ago: connection refused") || !strings.Contains(v, "task-0") {
		t.Fatalf("the banner:\n%s", v)
	}
	// A tick fetches again; the fetch's own answer clears the banner.
	_, cmd := m.Update(tickMsg{})
	if cmd == nil || !m.fetching {
		t.Fatal("a tick while unreachable does not fetch again")
	}
	m.Update(frameMsg{tree: bigTree(10), at: epoch.Add(4 * time.Second)})
	if strings.Contains(m.View(), "unreachable") {
		t.Fatal("the banner stays after governord answered")
	}
}

func BenchmarkViewTenThousandNodes(b *testing.B) {
	src := &fakeSource{}
	m := New(src, "x", time.Second)
	m.Update(tea.WindowSizeMsg{Width: 140, Height: 50})
	tree := bigTree(10_000)
	b.Run("frame", func(b *testing.B) {
		for range b.N {
			m.Update(frameMsg{tree: tree, at: epoch})
		}
	})
	b.Run("view", func(b *testing.B) {
		for range b.N {
			_ = m.View()
		}
	})
}
