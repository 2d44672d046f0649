package usage

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

type recorder struct{ events []engine.Event }

func (r *recorder) Emit(ev engine.Event) { r.events = append(r.events, ev) }

// storeOf merges records as the store does, by key.
type storeOf map[Key]Record

func (s storeOf) add(recs []Record) {
	for _, r := range recs {
		if old, ok := s[r.Key]; ok {
			old.Amount = Merge(old.Amount, r.Amount, r.Kind)
			s[r.Key] = old
		} else {
			s[r.Key] = r
		}
	}
}

// window gives the records Report reads for w, as the store's query does:
// those in the window and the newest HeldEnd of each key before it.
func (s storeOf) window(w Window) []Record {
	var out []Record
	carry := map[[3]any]Record{}
	for _, r := range s {
		switch {
		case r.Minute >= w.From && r.Minute < w.To:
			out = append(out, r)
		case r.Minute < w.From && r.Kind == HeldEnd:
			k := [3]any{r.Tenant, r.Task, r.Name}
			if c, ok := carry[k]; !ok || c.Minute < r.Minute {
				carry[k] = r
			}
		}
	}
	for _, r := range carry {
		out = append(out, r)
	}
	return out
}

// TestReportMatchesTheEvents runs random histories on a real engine, folds
// their events into records (restarting the fold from a snapshot half-way,
// as governord does at startup), and checks every figure of reports over
// random windows against a recomputation from the raw event log: the events
// replayed one by one into a second engine, whose state after each says
// what was spent (used) and held (held) at that instant.
func TestReportMatchesTheEvents(t *testing.T) {
	seeds := 30
	if testing.Short() {
		seeds = 5
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { checkSeed(t, uint64(seed)) })
	}
}

func checkSeed(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	clock := &fakeClock{}
	clock.ns.Store(time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC).UnixNano() + rng.Int64N(int64(time.Minute)))
	rec := &recorder{}
	e, err := engine.New(engine.Config{Clock: clock, Sink: rec, Retention: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fold := New(e.Snapshot())
	st := storeOf{}
	folded := 0
	feed := func() {
		for ; folded < len(rec.events); folded++ {
			fold.Add(rec.events[folded])
			if rng.IntN(3) == 0 {
				st.add(fold.Take()) // a commit of a batch
			}
		}
		st.add(fold.Take())
	}
	d := newDriver(t, rng, e, clock)
	for step := range 1500 {
		d.step()
		if step == 700 { // a restart: the fold starts again from the state
			feed()
			fold = New(e.Snapshot())
		}
	}
	feed()

	truth := recompute(t, rec.events)
	last := rec.events[len(rec.events)-1].At
	first := rec.events[0].At
	for range 20 {
		from := MinuteOf(first) + rng.Int64N(MinuteOf(last)-MinuteOf(first)+2) - 1
		to := from + 1 + rng.Int64N(30)
		now := last + rng.Int64N(int64(2*time.Minute))
		if rng.IntN(3) == 0 { // a window reaching past now
			now = last
		}
		w := Window{From: from, To: to, Now: now}
		got := Report(st.window(w), w)
		want := truth.report(w)
		if g, wnt := flatten(got), flatten(want); g != wnt {
			t.Fatalf("window %+v:\n got %s\nwant %s", w, g, wnt)
		}
	}
}

func flatten(lines []Line) string {
	var out []string
	for _, l := range lines {
		for _, m := range []struct {
			what string
			m    map[string]int64
		}{{"spend", l.Spend}, {"slotns", l.SlotNanos}, {"peak", l.Peak}, {"denied", l.Denied}} {
			for k, v := range m.m {
				if v != 0 {
					out = append(out, fmt.Sprintf("%d/%d %s %s=%d", l.Tenant, l.Task, m.what, k, v))
				}
			}
		}
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

// truth is what the raw events say: after each event, the used and held
// of every tenant and task.
type truth struct {
	at    []int64
	used  []map[group]map[string]int64 // direct spend owners: tenant line 0 = the tenant itself
	held  []map[group]map[string]int64 // tenant (task 0) and task subtrees
	spent []map[group]map[string]int64 // what each event spent, by group
}

func recompute(t *testing.T, events []engine.Event) *truth {
	clock := &fakeClock{}
	e, err := engine.New(engine.Config{Clock: clock, Retention: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	tr := &truth{}
	prevUsed := map[engine.NodeID]map[string]int64{}
	for _, ev := range events {
		clock.ns.Store(ev.At)
		if err := e.Apply(ev); err != nil {
			t.Fatal(err)
		}
		snap := e.Snapshot()
		byID := map[engine.NodeID]engine.NodeView{}
		for _, n := range snap.Nodes {
			byID[n.ID] = n
		}
		depth := func(n engine.NodeView) int {
			d := 0
			for p := n.Parent; p != 0; p = byID[p].Parent {
				d++
			}
			return d
		}
		spent := map[group]map[string]int64{}
		held := map[group]map[string]int64{}
		usedNow := map[engine.NodeID]map[string]int64{}
		delta := func(id engine.NodeID) map[string]int64 {
			out := map[string]int64{}
			n, ok := byID[id]
			if !ok {
				return out // reclaimed: its use stays in its parent, unchanged
			}
			for r, u := range n.Used {
				out[r] = u - prevUsed[id][r]
			}
			for r, u := range prevUsed[id] {
				if _, still := n.Used[r]; !still {
					out[r] = -u
				}
			}
			return out
		}
		for _, n := range snap.Nodes {
			usedNow[n.ID] = n.Used
			switch depth(n) {
			case 1: // a tenant: its own spend is its use less its tasks'
				own := delta(n.ID)
				for _, c := range snap.Nodes {
					if c.Parent == n.ID {
						for r, v := range delta(c.ID) {
							own[r] -= v
						}
					}
				}
				spent[group{int64(n.ID), 0}] = own
				held[group{int64(n.ID), 0}] = n.Held
			case 2:
				spent[group{int64(n.Parent), int64(n.ID)}] = delta(n.ID)
				held[group{int64(n.Parent), int64(n.ID)}] = n.Held
			case 0:
				own := delta(n.ID)
				for _, c := range snap.Nodes {
					if c.Parent == n.ID {
						for r, v := range delta(c.ID) {
							own[r] -= v
						}
					}
				}
				spent[group{0, 0}] = own
			}
		}
		prevUsed = usedNow
		tr.at = append(tr.at, ev.At)
		tr.spent = append(tr.spent, spent)
		tr.held = append(tr.held, held)
	}
	return tr
}

func (tr *truth) report(w Window) []Line {
	start, end := w.From*minuteNanos, min(w.To*minuteNanos, w.Now)
	if end <= start {
		return nil
	}
	lines := map[group]*Line{}
	line := func(g group) *Line {
		if lines[g] == nil {
			lines[g] = &Line{Tenant: g.tenant, Task: g.task, Spend: map[string]int64{}, SlotNanos: map[string]int64{},
				Peak: map[string]int64{}, Denied: map[string]int64{}}
		}
		return lines[g]
	}
	for i, at := range tr.at {
		inWindow := at >= start && at < w.To*minuteNanos
		carried := at < start && (i+1 == len(tr.at) || tr.at[i+1] >= start)
		if inWindow {
			for g, m := range tr.spent[i] {
				for r, v := range m {
					line(g).Spend[r] += v
					if g.task != 0 {
						line(group{g.tenant, 0}).Spend[r] += v
					}
				}
			}
		}
		// The level after event i holds until the next event.
		next := end
		if i+1 < len(tr.at) {
			next = min(tr.at[i+1], end)
		}
		from := max(at, start)
		for g, m := range tr.held[i] {
			for c, h := range m {
				if next > from {
					line(g).SlotNanos[c] += h * (next - from)
				}
				if (inWindow || carried) && h > line(g).Peak[c] {
					line(g).Peak[c] = h
				}
			}
		}
	}
	var out []Line
	for _, l := range lines {
		out = append(out, *l)
	}
	return out
}
