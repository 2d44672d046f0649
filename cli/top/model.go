package top

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/cli/slots"
	"github.com/governor-project/governor/cli/tenantstate"
)

// DefaultRefresh is how often the screen asks governord again.
const DefaultRefresh = time.Second

// detailLines is the height of the panel about the selected node.
const detailLines = 13

// mode is what the keyboard is doing.
type mode int

const (
	modeBrowse mode = iota
	modeFilter
	modeEditCap
	modeEditReason
	modeConfirm
)

// row is one line of the tree as shown.
type row struct {
	node  *governorpb.Node
	depth int
	path  string
	use   float64 // the fullest cap's share in use, for sorting
}

// Model is the screen. Its zero value is not usable: use New.
type Model struct {
	src     Source
	refresh time.Duration
	now     func() time.Time
	title   string

	width, height int

	tree     *governorpb.ListTreeResponse
	inspect  *governorpb.Inspection      // the selected node's
	state    *tenantstate.State          // the selected node's, when it is a tenant
	caps     *governorpb.CapStatusReport // the selected node's chain
	pool     *governorpb.Inspection      // the whole view's
	treeAt   time.Time                   // when tree last arrived
	err      error                       // the last fetch's failure; nil once one works
	fetching bool

	rows     []row
	byID     map[int64]*governorpb.Node
	selected int64 // the selected node's id, kept across refreshes
	cursor   int
	offset   int
	sortUse  bool
	filter   string

	mode    mode
	input   string
	editCap capEdit
	status  string

	prevSeq uint64
	prevAt  time.Time
	rate    float64
}

type capEdit struct {
	node   int64
	path   string
	limit  bool
	name   string
	value  int64
	old    int64 // -1: none
	reason string
}

// New returns the screen over src, titled title (governord's address).
func New(src Source, title string, refresh time.Duration) *Model {
	if refresh <= 0 {
		refresh = DefaultRefresh
	}
	return &Model{src: src, title: title, refresh: refresh, now: time.Now, width: 120, height: 40}
}

// Messages.
type (
	tickMsg  struct{}
	frameMsg struct {
		tree    *governorpb.ListTreeResponse
		inspect *governorpb.Inspection      // the selected node's
		state   *tenantstate.State          // the selected node's, when it is a tenant
		caps    *governorpb.CapStatusReport // the selected node's chain
		pool    *governorpb.Inspection      // the whole view's, for the header
		err     error
		at      time.Time
	}
	capSetMsg struct {
		edit capEdit
		err  error
	}
)

// Init starts the first fetch and the refresh ticks.
func (m *Model) Init() tea.Cmd {
	m.fetching = true
	return tea.Batch(m.fetch(), m.tick())
}

func (m *Model) tick() tea.Cmd {
	return tea.Tick(m.refresh, func(time.Time) tea.Msg { return tickMsg{} })
}

// fetch asks for the tree and the selected node's details.
func (m *Model) fetch() tea.Cmd {
	src, sel, timeout, now := m.src, m.selected, m.refresh*2, m.now
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), max(timeout, 2*time.Second))
		defer cancel()
		tree, err := src.Tree(ctx)
		if err != nil {
			return frameMsg{err: err, at: now()}
		}
		var top int64
		if len(tree.GetNodes()) > 0 {
			top = tree.GetNodes()[0].GetId()
		}
		pool, err := src.Inspect(ctx, top)
		if err != nil {
			return frameMsg{err: err, at: now()}
		}
		in := pool
		if sel != 0 && sel != top {
			if in, err = src.Inspect(ctx, sel); err != nil {
				in = nil // the node may have just ended; the tree still shows
			}
		}
		f := frameMsg{tree: tree, inspect: in, pool: pool, at: now()}
		if f.caps, err = src.CapStatus(ctx, cmp.Or(sel, top)); err != nil {
			f.caps = nil // as for the inspection: the node may have just ended
		}
		for _, n := range tree.GetNodes() {
			if id := n.GetId(); (id == sel || sel == 0 && id == top) && n.GetKind() == governorpb.NodeKind_NODE_KIND_TENANT {
				if st, err := src.TenantState(ctx, n); err == nil {
					f.state = &st
				}
				break
			}
		}
		return f
	}
}

// Update handles a message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		m.clamp()
	case tickMsg:
		cmds := []tea.Cmd{m.tick()}
		if !m.fetching {
			m.fetching = true
			cmds = append(cmds, m.fetch())
		}
		return m, tea.Batch(cmds...)
	case frameMsg:
		m.fetching = false
		m.apply(msg)
	case capSetMsg:
		if msg.err != nil {
			m.status = "not changed: " + msg.err.Error()
		} else {
			m.status = fmt.Sprintf("%s.%s on %s: %s -> %s (audited: %q)", kindWord(msg.edit.limit), msg.edit.name, msg.edit.path,
				capText(msg.edit.old), capText(msg.edit.value), msg.edit.reason)
		}
		if !m.fetching {
			m.fetching = true
			return m, m.fetch()
		}
	case tea.KeyMsg:
		return m.key(msg)
	}
	return m, nil
}

func (m *Model) apply(f frameMsg) {
	if f.err != nil {
		m.err = f.err
		return
	}
	m.err = nil
	if f.pool == nil {
		f.pool = f.inspect
	}
	if f.pool != nil {
		if !m.prevAt.IsZero() {
			if dt := f.at.Sub(m.prevAt).Seconds(); dt > 0 && f.pool.GetSeq() >= m.prevSeq {
				m.rate = float64(f.pool.GetSeq()-m.prevSeq) / dt
			}
		}
		m.prevSeq, m.prevAt = f.pool.GetSeq(), f.at
	}
	m.tree, m.inspect, m.state, m.pool, m.treeAt = f.tree, f.inspect, f.state, f.pool, f.at
	m.caps = f.caps
	m.rebuild()
}

// rebuild lays the tree out as rows: depth first, siblings by name or by
// use, kept to the filter's matches and their ancestors.
func (m *Model) rebuild() {
	nodes := m.tree.GetNodes()
	m.byID = make(map[int64]*governorpb.Node, len(nodes))
	children := make(map[int64][]*governorpb.Node, len(nodes))
	var top *governorpb.Node
	for i, n := range nodes {
		m.byID[n.GetId()] = n
		if i == 0 {
			top = n
			continue
		}
		children[n.GetParentId()] = append(children[n.GetParentId()], n)
	}
	m.rows = m.rows[:0]
	if top == nil {
		return
	}
	filter := strings.ToLower(m.filter)
	var walk func(n *governorpb.Node, depth int, path string) bool
	walk = func(n *governorpb.Node, depth int, path string) bool {
		at := len(m.rows)
		m.rows = append(m.rows, row{node: n, depth: depth, path: path, use: use(n)})
		kids := children[n.GetId()]
		if m.sortUse {
			slices.SortStableFunc(kids, func(a, b *governorpb.Node) int { return cmp.Compare(use(b), use(a)) })
		}
		kept := false
		for _, c := range kids {
			p := c.GetName()
			if path != "" {
				p = path + "/" + c.GetName()
			}
			kept = walk(c, depth+1, p) || kept
		}
		if filter == "" || kept || strings.Contains(strings.ToLower(path), filter) || strings.Contains(strings.ToLower(n.GetName()), filter) {
			return true
		}
		m.rows = m.rows[:at] // neither it nor anything below matches
		return false
	}
	walk(top, 0, "")
	m.cursor = 0
	for i, r := range m.rows {
		if r.node.GetId() == m.selected {
			m.cursor = i
			break
		}
	}
	m.clamp()
}

// use is the fullest cap's share in use on n.
func use(n *governorpb.Node) float64 {
	u := 0.0
	for k, c := range n.GetQuotas() {
		if c > 0 {
			u = max(u, float64(n.GetUsed()[k]+n.GetReserved()[k])/float64(c))
		} else if n.GetUsed()[k] > 0 {
			u = max(u, 1)
		}
	}
	for k, c := range n.GetLimits() {
		if c > 0 {
			u = max(u, float64(n.GetHeld()[k])/float64(c))
		}
	}
	return u
}

// fixedLines are the lines that are not tree rows: the header, the banner
// or status line, the column names, the rule, the panel and the footer.
const fixedLines = 5 + detailLines

// listHeight is how many tree rows fit.
func (m *Model) listHeight() int {
	return max(1, m.height-fixedLines)
}

func (m *Model) clamp() {
	if m.cursor >= len(m.rows) {
		m.cursor = len(m.rows) - 1
	}
	if m.cursor < 0 {
		m.cursor = 0
	}
	h := m.listHeight()
	if m.cursor < m.offset {
		m.offset = m.cursor
	}
	if m.cursor >= m.offset+h {
		m.offset = m.cursor - h + 1
	}
	m.offset = max(0, min(m.offset, len(m.rows)-h))
	if len(m.rows) > 0 {
		m.selected = m.rows[m.cursor].node.GetId()
	}
}

func (m *Model) key(k tea.KeyMsg) (tea.Model, tea.Cmd) {
	switch m.mode {
	case modeFilter, modeEditCap, modeEditReason:
		return m.typing(k)
	case modeConfirm:
		switch k.String() {
		case "y", "Y":
			m.mode = modeBrowse
			e, src := m.editCap, m.src
			m.status = "setting..."
			return m, func() tea.Msg {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				return capSetMsg{edit: e, err: src.SetCap(ctx, e.node, e.limit, e.name, e.value, e.reason)}
			}
		default:
			m.mode, m.status = modeBrowse, "not changed"
		}
		return m, nil
	}
	prev := m.selected
	switch k.String() {
	case "q", "ctrl+c":
		return m, tea.Quit
	case "up", "k":
		m.cursor--
	case "down", "j":
		m.cursor++
	case "pgup":
		m.cursor -= m.listHeight()
	case "pgdown", " ":
		m.cursor += m.listHeight()
	case "home", "g":
		m.cursor = 0
	case "end", "G":
		m.cursor = len(m.rows) - 1
	case "s":
		m.sortUse = !m.sortUse
		m.rebuild()
	case "/":
		m.mode, m.input = modeFilter, m.filter
	case "e":
		if len(m.rows) > 0 {
			r := m.rows[m.cursor]
			m.editCap = capEdit{node: r.node.GetId(), path: r.path}
			m.mode, m.input, m.status = modeEditCap, "", ""
		}
	case "r":
		if !m.fetching {
			m.fetching = true
			return m, m.fetch()
		}
	}
	m.clamp()
	if m.selected != prev && !m.fetching {
		m.fetching = true // the panel follows the selection at once
		return m, m.fetch()
	}
	return m, nil
}

// typing edits the line being typed: a filter, a cap, a reason.
func (m *Model) typing(k tea.KeyMsg) (tea.Model, tea.Cmd) {
	switch k.Type {
	case tea.KeyEsc:
		if m.mode == modeFilter {
			m.filter = ""
			m.rebuild()
		}
		m.mode, m.status = modeBrowse, ""
		return m, nil
	case tea.KeyBackspace:
		if r := []rune(m.input); len(r) > 0 {
			m.input = string(r[:len(r)-1])
		}
	case tea.KeyRunes, tea.KeySpace:
		if len(k.Runes) == 0 && k.Type == tea.KeySpace {
			m.input += " "
		} else {
			m.input += string(k.Runes)
		}
	case tea.KeyEnter:
		return m.enter()
	}
	if m.mode == modeFilter {
		m.filter = m.input
		m.rebuild()
	}
	return m, nil
}

func (m *Model) enter() (tea.Model, tea.Cmd) {
	switch m.mode {
	case modeFilter:
		m.mode = modeBrowse
	case modeEditCap:
		limit, name, value, err := parseCap(m.input)
		if err != nil {
			m.status = err.Error()
			return m, nil
		}
		e := &m.editCap
		e.limit, e.name, e.value, e.old = limit, name, value, -1
		if n := m.byID[e.node]; n != nil {
			caps := n.GetQuotas()
			if limit {
				caps = n.GetLimits()
			}
			if v, ok := caps[name]; ok {
				e.old = v
			}
		}
		m.mode, m.input, m.status = modeEditReason, "", ""
	case modeEditReason:
		if strings.TrimSpace(m.input) == "" {
			m.status = "a reason is required: it is kept in the audit trail"
			return m, nil
		}
		m.editCap.reason = strings.TrimSpace(m.input)
		m.mode, m.input = modeConfirm, ""
	}
	return m, nil
}

// parseCap reads "quota.NAME=N" or "limit.NAME=N" (N may be "none").
func parseCap(s string) (limit bool, name string, value int64, err error) {
	key, val, ok := strings.Cut(strings.TrimSpace(s), "=")
	kind, name, ok2 := strings.Cut(key, ".")
	if !ok || !ok2 || name == "" || (kind != "quota" && kind != "limit") {
		return false, "", 0, fmt.Errorf("%q: type quota.NAME=N or limit.NAME=N (N a number, or none)", s)
	}
	value = -1
	if val != "none" {
		if value, err = strconv.ParseInt(val, 10, 64); err != nil || value < 0 {
			return false, "", 0, fmt.Errorf("%q: the value is a whole number >= 0, or none", val)
		}
	}
	return kind == "limit", name, value, nil
}

// Styles.
var (
	headerStyle   = lipgloss.NewStyle().Bold(true)
	bannerStyle   = lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("15")).Background(lipgloss.Color("1"))
	selectedStyle = lipgloss.NewStyle().Reverse(true)
	dimStyle      = lipgloss.NewStyle().Faint(true)
	fullStyle     = lipgloss.NewStyle().Foreground(lipgloss.Color("1"))
)

// View draws the screen: only the rows that fit, so its cost follows the
// terminal's height, not the tree's size.
func (m *Model) View() string {
	var b strings.Builder
	line := func(s string) {
		b.WriteString(truncate(s, m.width))
		b.WriteByte('\n')
	}
	line(headerStyle.Render(m.header()))
	switch {
	case m.err != nil:
		age := "no data yet"
		if !m.treeAt.IsZero() {
			age = fmt.Sprintf("showing data from %s ago", m.now().Sub(m.treeAt).Round(time.Second))
		}
		line(bannerStyle.Render(fmt.Sprintf(" governord unreachable — retrying every %v; %s: %v ", m.refresh, age, m.err)))
	default:
		line(dimStyle.Render(fmt.Sprintf("sort: %s   filter: %q   %d rows", map[bool]string{true: "use", false: "tree"}[m.sortUse], m.filter, len(m.rows))))
	}
	line(headerStyle.Render(fmt.Sprintf("%-36s %-34s %-18s %6s %8s", "NODE", "QUOTA used/cap", "LIMIT held/limit", "QUEUE", "AGE")))
	h := m.listHeight()
	for i := m.offset; i < m.offset+h; i++ {
		if i >= len(m.rows) {
			line("")
			continue
		}
		s := m.rowText(m.rows[i])
		if i == m.cursor {
			s = selectedStyle.Render(padRight(s, m.width))
		}
		line(s)
	}
	line(strings.Repeat("─", max(10, m.width)))
	for _, l := range m.detail() {
		line(l)
	}
	line(m.footer())
	return strings.TrimSuffix(b.String(), "\n")
}

func (m *Model) header() string {
	leases, waiters, commit := "-", "-", "-"
	if in := m.pool; in != nil {
		leases, waiters = strconv.Itoa(int(in.GetLeaseCount())), strconv.Itoa(int(in.GetWaiterCount()))
		commit = fmt.Sprintf("%.1fms", float64(in.GetLastCommit().AsDuration().Microseconds())/1000)
	}
	nodes := len(m.byID)
	more := ""
	if m.tree.GetTruncated() {
		more = "+"
	}
	return fmt.Sprintf("governor top  %s  nodes %d%s  leases %s  waiters %s  commit %s  events %.1f/s", m.title, nodes, more, leases, waiters, commit, m.rate)
}

func (m *Model) rowText(r row) string {
	n := r.node
	name := strings.Repeat("  ", r.depth) + n.GetName()
	if st := n.GetTenantState(); st != "" && st != tenantstate.Active {
		name += " [" + st + "]" // the tenant refuses work: seen without selecting it
	}
	quota := ""
	if k, c, u, ok := fullest(n.GetQuotas(), n.GetUsed(), n.GetReserved()); ok {
		quota = fmt.Sprintf("%s %d/%d %s", k, u, c, bar(u, c, 10))
	}
	limit := ""
	if k, c, u, ok := fullest(n.GetLimits(), n.GetHeld(), nil); ok {
		limit = fmt.Sprintf("%s %d/%d", k, u, c)
	}
	age := ""
	if n.GetCreated() != nil {
		age = shortDuration(m.now().Sub(n.GetCreated().AsTime()))
	}
	s := fmt.Sprintf("%-36s %-34s %-18s %6d %8s", truncate(name, 36), truncate(quota, 34), truncate(limit, 18), m.tree.GetWaiting()[n.GetId()], age)
	if r.use >= 1 {
		s = fullStyle.Render(s)
	}
	return s
}

// fullest picks the cap with the largest share in use.
func fullest(caps, used, reserved map[string]int64) (key string, capV, usedV int64, ok bool) {
	best := -1.0
	for _, k := range slices.Sorted(maps.Keys(caps)) {
		c, u := caps[k], used[k]+reserved[k]
		share := 1.0
		if c > 0 {
			share = float64(u) / float64(c)
		}
		if share > best {
			best, key, capV, usedV, ok = share, k, c, u, true
		}
	}
	return
}

func (m *Model) detail() []string {
	out := make([]string, 0, detailLines)
	add := func(format string, a ...any) {
		if len(out) < detailLines {
			out = append(out, fmt.Sprintf(format, a...))
		}
	}
	if len(m.rows) == 0 {
		add("(nothing to show)")
	} else {
		r := m.rows[m.cursor]
		n := r.node
		add("%s  (id %d)", headerStyle.Render(cmp.Or(r.path, n.GetName())), n.GetId())
		if st := m.state; st != nil && m.selected == n.GetId() {
			add("state: %s", st.Text(m.now()))
		}
		var quotas, limits []string
		for _, k := range slices.Sorted(maps.Keys(n.GetQuotas())) {
			quotas = append(quotas, fmt.Sprintf("%s %d/%d", k, n.GetUsed()[k]+n.GetReserved()[k], n.GetQuotas()[k]))
		}
		for _, k := range slices.Sorted(maps.Keys(n.GetLimits())) {
			limits = append(limits, fmt.Sprintf("%s %d/%d", k, n.GetHeld()[k], n.GetLimits()[k]))
		}
		add("quotas: %s", cmp.Or(strings.Join(quotas, "  "), "none"))
		add("limits: %s", cmp.Or(strings.Join(limits, "  "), "none"))
		if rates := m.rateText(n.GetId()); rates != "" && m.selected == n.GetId() {
			add("rates (left/burst): %s", rates)
		}
		if in := m.inspect; in != nil && m.selected == n.GetId() {
			now := in.GetServerTime().AsTime()
			held := heldNow(in.GetLeases(), now)
			var t slots.Tally
			for _, l := range held {
				t.Add(l)
			}
			more := ""
			if int(in.GetLeaseCount()) > len(in.GetLeases()) {
				more = fmt.Sprintf(" (of the first %d of %d)", len(in.GetLeases()), in.GetLeaseCount())
			}
			add("held: %s%s", t.Text(), more)
			for i, l := range held {
				if i == 4 {
					break
				}
				add("  %s", slots.Text(l, now))
			}
			add("recent denials (%d):", len(in.GetRecentDenials()))
			for i, d := range in.GetRecentDenials() {
				if i == 4 {
					break
				}
				add("  %s ago  %s  on node %d", shortDuration(now.Sub(d.GetAt().AsTime())), d.GetCause(), d.GetNodeId())
			}
		}
	}
	for len(out) < detailLines {
		out = append(out, "")
	}
	return out
}

// rateText is the rates on node's chain as the last cap status read them:
// what each bucket holds of its burst, the rate, how long until it is
// full, and the node it is on when that is an ancestor.
func (m *Model) rateText(node int64) string {
	rep := m.caps
	if rep == nil {
		return ""
	}
	var parts []string
	for _, r := range rep.GetRates() {
		s := fmt.Sprintf("%s %d/%d (%s", r.GetName(), r.GetLevel(), r.GetSize(),
			governorpb.FormatRate(r.GetRate().GetUnits(), r.GetRate().GetPer().AsDuration()))
		if d := r.GetFullIn().AsDuration(); d > 0 {
			s += ", full in " + shortDuration(d)
		}
		if r.GetSlices() > 0 {
			s += fmt.Sprintf(", %d lent", r.GetLent())
		}
		s += ")"
		if r.GetNodeId() != node {
			s += " on " + r.GetNodeName()
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "  ")
}

// heldNow lists the leases and the blocks that hold slots, the work held
// longest first (a block whose use is not reported by its age), so that
// what may be stuck shows before idle slots; blocks of no slots hold
// nothing and are left out.
func heldNow(leases []*governorpb.LeaseInfo, now time.Time) []*governorpb.LeaseInfo {
	out := make([]*governorpb.LeaseInfo, 0, len(leases))
	for _, l := range leases {
		if !l.GetBlock() || l.GetCount() > 0 {
			out = append(out, l)
		}
	}
	age := func(l *governorpb.LeaseInfo) time.Duration {
		if d, ok := slots.Held(l, now); ok {
			return d
		}
		return now.Sub(l.GetGranted().AsTime())
	}
	slices.SortStableFunc(out, func(a, b *governorpb.LeaseInfo) int { return cmp.Compare(age(b), age(a)) })
	return out
}

func (m *Model) footer() string {
	switch m.mode {
	case modeFilter:
		return "filter: " + m.input + "█  (enter keeps it, esc clears)"
	case modeEditCap:
		return fmt.Sprintf("set a cap on %s — quota.NAME=N or limit.NAME=N (none removes): %s█", m.editCap.path, m.input)
	case modeEditReason:
		return fmt.Sprintf("reason for %s.%s=%s (kept in the audit trail): %s█", kindWord(m.editCap.limit), m.editCap.name, capText(m.editCap.value), m.input)
	case modeConfirm:
		e := m.editCap
		return fmt.Sprintf("set %s.%s on %s: %s -> %s, because %q? [y/n]", kindWord(e.limit), e.name, e.path, capText(e.old), capText(e.value), e.reason)
	}
	if m.status != "" {
		return m.status
	}
	return dimStyle.Render("↑↓ pgup pgdn move   s sort   / filter   e edit a cap   r refresh   q quit")
}

func kindWord(limit bool) string {
	if limit {
		return "limit"
	}
	return "quota"
}

func capText(v int64) string {
	if v < 0 {
		return "none"
	}
	return strconv.FormatInt(v, 10)
}

// bar draws used/cap in width cells.
func bar(used, c int64, width int) string {
	filled := width
	if c > 0 {
		filled = int(min(used, c) * int64(width) / c)
	}
	return "[" + strings.Repeat("█", filled) + strings.Repeat("·", width-filled) + "]"
}

// shortDuration is an age as slots.Age prints it, in days from two days on:
// top's nodes and denials can be that old.
func shortDuration(d time.Duration) string {
	if d >= 48*time.Hour {
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	return slots.Age(d)
}

// truncate cuts s to width cells, styles aside.
func truncate(s string, width int) string {
	if width <= 0 || lipgloss.Width(s) <= width {
		return s
	}
	r := []rune(s)
	for len(r) > 0 && lipgloss.Width(string(r)) > width {
		r = r[:len(r)-1]
	}
	return string(r)
}

func padRight(s string, width int) string {
	if w := lipgloss.Width(s); w < width {
		return s + strings.Repeat(" ", width-w)
	}
	return s
}
