package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// govbench plot draws the figures of docs/bench.md from the JSON a run
// wrote (-in), as PNGs (-out): the downstream's concurrency over time and
// each tenant's latency distribution (fanout.json), the adaptive limit
// following the capacity drop (adaptive.json), and throughput against
// callers per store (durable.json). A scenario whose JSON is missing is
// skipped with a note.
func plotMain(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("plot", stderr)
	in := fs.String("in", "docs/bench", "the folder of a run's JSON")
	out := fs.String("out", "", "the folder to write the PNGs to (default: -in)")
	if fs.Parse(args) != nil {
		return 2
	}
	if *out == "" {
		*out = *in
	}
	failed := false
	for _, f := range []struct {
		json string
		draw func(raw json.RawMessage, out string) ([]string, error)
	}{{"fanout.json", plotFanout}, {"adaptive.json", plotAdaptive}, {"durable.json", plotDurable}} {
		b, err := os.ReadFile(filepath.Join(*in, f.json))
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(stderr, "govbench plot: no %s in %s: its figures are not drawn\n", f.json, *in)
			continue
		}
		var r struct{ Raw json.RawMessage }
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		var wrote []string
		if err == nil {
			wrote, err = f.draw(r.Raw, *out)
		}
		if err != nil {
			fmt.Fprintf(stderr, "govbench plot: %s: %v\n", f.json, err)
			failed = true
			continue
		}
		for _, w := range wrote {
			fmt.Fprintln(stdout, w)
		}
	}
	if failed {
		return 1
	}
	return 0
}

var (
	colorWithout = color.RGBA{R: 200, G: 60, B: 40, A: 255}
	colorWith    = color.RGBA{R: 30, G: 100, B: 200, A: 255}
	colorOther   = color.RGBA{R: 90, G: 90, B: 90, A: 255}
)

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Y.Tick.Marker = wholeTicks{}
	return p
}

// wholeTicks are the default ticks, labelled without decimals.
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" && hi-lo >= 5 {
			ticks[i].Label = strconv.FormatFloat(t.Value, 'f', 0, 64)
		}
	}
	return ticks
}

func addLine(p *plot.Plot, name string, pts plotter.XYs, c color.Color, step bool, dashed bool) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	l.Color, l.Width = c, vg.Points(1.2)
	if step {
		l.StepStyle = plotter.PostStep
	}
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

func save(p *plot.Plot, out, name string) (string, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(out, name)
	return path, p.Save(8*vg.Inch, 4*vg.Inch, path)
}

func plotFanout(raw json.RawMessage, out string) ([]string, error) {
	var r struct {
		Params  fanoutParams
		Without fanoutSide
		With    fanoutSide
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	// The downstream's concurrency over time, both sides and its capacity.
	p := newPlot("The downstream's calls in flight", "time (ms)", "calls in flight")
	end := 0.0
	for _, s := range []struct {
		name string
		side fanoutSide
		c    color.Color
	}{{"without Governor", r.Without, colorWithout}, {"with Governor", r.With, colorWith}} {
		pts := make(plotter.XYs, len(s.side.Concurrency))
		for i, c := range s.side.Concurrency {
			pts[i].X, pts[i].Y = c[0], c[1]
			end = max(end, c[0])
		}
		if err := addLine(p, s.name, pts, s.c, true, false); err != nil {
			return nil, err
		}
	}
	if err := addLine(p, "capacity", plotter.XYs{{X: 0, Y: float64(r.Params.Capacity)}, {X: end, Y: float64(r.Params.Capacity)}}, colorOther, false, true); err != nil {
		return nil, err
	}
	concurrency, err := save(p, out, "fanout-concurrency.png")
	if err != nil {
		return nil, err
	}
	// Each tenant's job latency, as a distribution (the share of jobs done
	// within a time), both sides.
	p = newPlot("Job latency by tenant", "latency (ms)", "share of jobs done within it")
	for _, s := range []struct {
		name string
		side fanoutSide
		c    color.Color
	}{{"without", r.Without, colorWithout}, {"with Governor", r.With, colorWith}} {
		for _, tenant := range []string{"busy", "quiet"} {
			l := slices.Clone(s.side.LatencyMs[tenant])
			if len(l) == 0 {
				return nil, fmt.Errorf("no latencies of %s %s (a run from before govbench wrote them?)", s.name, tenant)
			}
			slices.Sort(l)
			pts := make(plotter.XYs, len(l))
			for i, v := range l {
				pts[i].X, pts[i].Y = v, float64(i+1)/float64(len(l))
			}
			if err := addLine(p, s.name+", "+tenant, pts, s.c, true, tenant == "quiet"); err != nil {
				return nil, err
			}
		}
	}
	// Top left, clear of the quiet tenant's lines.
	p.Legend.Left, p.Legend.Top, p.Legend.XOffs = true, true, vg.Points(150)
	latency, err := save(p, out, "fanout-latency.png")
	if err != nil {
		return nil, err
	}
	return []string{concurrency, latency}, nil
}

func plotAdaptive(raw json.RawMessage, out string) ([]string, error) {
	var r struct {
		Params   adaptiveParams
		Fixed    adaptiveSide
		Adaptive adaptiveSide
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	p := newPlot("The pool's limit through the capacity drop", "time (ms)", "limit")
	for _, s := range []struct {
		name string
		side adaptiveSide
		c    color.Color
	}{{"fixed", r.Fixed, colorWithout}, {"adaptive (AIMD)", r.Adaptive, colorWith}} {
		pts := make(plotter.XYs, len(s.side.Limit))
		for i, v := range s.side.Limit {
			pts[i].X, pts[i].Y = v[0], v[1]
		}
		if err := addLine(p, s.name, pts, s.c, true, false); err != nil {
			return nil, err
		}
	}
	drop := float64(r.Params.Before.Milliseconds())
	end := float64((r.Params.Before + r.Params.After).Milliseconds())
	if err := addLine(p, "the downstream's capacity", plotter.XYs{{X: 0, Y: 20}, {X: drop, Y: 20}, {X: drop, Y: 5}, {X: end, Y: 5}}, colorOther, false, true); err != nil {
		return nil, err
	}
	// Between the fixed limit and the capacity after the drop.
	p.Legend.Top, p.Legend.YOffs = true, -vg.Points(60)
	path, err := save(p, out, "adaptive-limit.png")
	if err != nil {
		return nil, err
	}
	return []string{path}, nil
}

func plotDurable(raw json.RawMessage, out string) ([]string, error) {
	var runs []durableRun
	if err := json.Unmarshal(raw, &runs); err != nil {
		return nil, err
	}
	p := newPlot("Consumes per second, each committed before its answer", "callers", "calls per second")
	colors := map[string]color.Color{"memory": colorOther, "sqlite": colorWithout, "postgres": colorWith}
	var stores []string
	byStore := map[string]plotter.XYs{}
	noop := map[int]float64{}
	for _, r := range runs {
		if byStore[r.Store] == nil {
			stores = append(stores, r.Store)
		}
		byStore[r.Store] = append(byStore[r.Store], plotter.XY{X: float64(r.Callers), Y: statOf(r.Consumes).med})
		noop[r.Callers] = max(noop[r.Callers], statOf(r.Noops).med)
	}
	for _, s := range stores {
		if err := addLine(p, s, byStore[s], colors[s], false, false); err != nil {
			return nil, err
		}
	}
	var ceiling plotter.XYs
	for _, n := range slices.Sorted(maps.Keys(noop)) {
		ceiling = append(ceiling, plotter.XY{X: float64(n), Y: noop[n]})
	}
	if err := addLine(p, "no-op call (the ceiling)", ceiling, colorOther, false, true); err != nil {
		return nil, err
	}
	p.Legend.Left = true
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, n := range slices.Sorted(maps.Keys(noop)) {
		ticks = append(ticks, plot.Tick{Value: float64(n), Label: strconv.Itoa(n)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	path, err := save(p, out, "durable-throughput.png")
	if err != nil {
		return nil, err
	}
	return []string{path}, nil
}
