package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The scenarios in their short mode, against real governords, checking the
// properties the figures rest on rather than the timings.

var (
	buildOnce sync.Once
	built     string
	buildErr  error
	buildDir  string
)

// testEnv is an env in short mode whose governord is built once per test
// binary.
func testEnv(t *testing.T) *env {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "govbench-test-")
		if buildErr == nil {
			built, buildErr = buildGovernord(buildDir)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	var log bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("govbench's log:\n%s", log.String())
		}
	})
	return &env{governord: built, dir: t.TempDir(), store: "memory", short: true, runs: 1, seed: 1, log: &log}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// With Governor the downstream never sees more calls at once than the pool
// allows; without, the fan-out overloads it. The counts are a function of
// the seed.
func TestFanoutPeakWithinLimit(t *testing.T) {
	e := testEnv(t)
	p := fanoutWorkload(true)
	without, err := fanoutSideRun(testContext(t), e, p, false)
	if err != nil {
		t.Fatal(err)
	}
	with, err := fanoutSideRun(testContext(t), e, p, true)
	if err != nil {
		t.Fatal(err)
	}
	if with.Peak > p.Capacity {
		t.Errorf("with Governor the downstream's peak concurrency is %d, over the limit %d", with.Peak, p.Capacity)
	}
	if n := with.Overloaded["busy"] + with.Overloaded["quiet"]; n != 0 {
		t.Errorf("with Governor %d calls were refused for overload, want 0", n)
	}
	if without.Peak <= p.Capacity {
		t.Errorf("without Governor the peak concurrency is %d, within the capacity %d: the workload does not overload", without.Peak, p.Capacity)
	}
	if n := with.JobsFailed["quiet"]; n != 0 {
		t.Errorf("with Governor %d of the quiet tenant's jobs failed", n)
	}
	again, err := fanoutSideRun(testContext(t), e, p, true)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(with)
	b, _ := json.Marshal(again)
	if !bytes.Equal(a, b) {
		t.Errorf("two runs of the same seed differ:\n%s\n%s", a, b)
	}
	t.Logf("peak without %d, with %d (capacity %d); calls without %d, with %d", without.Peak, with.Peak, p.Capacity,
		without.Calls["busy"]+without.Calls["quiet"], with.Calls["busy"]+with.Calls["quiet"])
}

// The command runs the scenarios it is asked for, prints a table and writes
// the raw results.
func TestCommandWritesResults(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-short", "-only", "retries", "-out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("govbench exited %d:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "Retries") {
		t.Errorf("no table in its output:\n%s", stdout.String())
	}
	b, err := os.ReadFile(filepath.Join(out, "retries.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r result
	if err := json.Unmarshal(b, &r); err != nil || len(r.Rows) == 0 {
		t.Errorf("retries.json holds no rows (%v):\n%s", err, b)
	}
	for _, bad := range [][]string{{"-only", "nope"}, {"-store", "redis"}, {"-runs", "0"}, {"extra"}} {
		stderr.Reset()
		if code := run(append([]string{}, bad...), &stdout, &stderr); code != 2 {
			t.Errorf("govbench %v exited %d, want 2", bad, code)
		}
	}
}

// A dead worker's slots go to the waiting tenant one TTL later, and its
// late releases are all refused: the leases stay with the waiter.
func TestDeadWorkerLateReleasesRefused(t *testing.T) {
	r, err := deadWorkerOnce(testContext(t), testEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.Refused != r.LateReleases || r.LateReleases != deadSlots {
		t.Errorf("%d of %d late releases refused, want all %d (%v)", r.Refused, r.LateReleases, deadSlots, r.RefusedWith)
	}
	if r.RootHolds != deadSlots || r.BLeasesValid != deadSlots {
		t.Errorf("after the late releases the root holds %d leases and %d of B's are valid, want %d and %d",
			r.RootHolds, r.BLeasesValid, deadSlots, deadSlots)
	}
	if r.LateHeartbeat == "OK" {
		t.Error("the dead worker's late heartbeat was accepted")
	}
	t.Logf("B had the pool after %v (TTL %v)", r.poolAfter.Round(time.Millisecond), deadTTL)
}

// With the downstream down, three nested loops of three attempts make 27
// requests a call; with a retry budget of 1, at most 2, and the caller
// still gets the downstream's error.
func TestRetriesWithinBudget(t *testing.T) {
	res, err := runRetries(testContext(t), testEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	sides := res.Raw.([]retriesSide)
	if w := sides[0]; w.MaxPerCall != 27 {
		t.Errorf("without Governor the most requests in one call were %d, want 27", w.MaxPerCall)
	}
	g := sides[1]
	if g.Budget != 1 || g.MaxPerCall > 2 {
		t.Errorf("with a retry budget of %d one call made %d requests, want a budget of 1 and at most 2", g.Budget, g.MaxPerCall)
	}
	if !g.ErrorsPreserved {
		t.Error("a governed call did not return the downstream's error")
	}
}

// After the downstream's capacity drops, the adaptive limit serves more and
// sheds less than the fixed one.
func TestAdaptiveServesMoreAfterDrop(t *testing.T) {
	e := testEnv(t)
	p := adaptiveWorkload(true)
	fixed, err := adaptiveSideRun(testContext(t), e, p, false)
	if err != nil {
		t.Fatal(err)
	}
	aimd, err := adaptiveSideRun(testContext(t), e, p, true)
	if err != nil {
		t.Fatal(err)
	}
	if aimd.ServedAfter <= fixed.ServedAfter {
		t.Errorf("after the drop adaptive served %d, fixed %d: adaptive should serve more", aimd.ServedAfter, fixed.ServedAfter)
	}
	if aimd.ShedAfter >= fixed.ShedAfter {
		t.Errorf("after the drop adaptive shed %d, fixed %d: adaptive should shed less", aimd.ShedAfter, fixed.ShedAfter)
	}
	if aimd.MeanLimit >= 20 {
		t.Errorf("the adaptive limit never moved (mean %.1f after the drop)", aimd.MeanLimit)
	}
	t.Logf("after the drop: fixed shed %d served %d; adaptive shed %d served %d (mean limit %.1f)",
		fixed.ShedAfter, fixed.ServedAfter, aimd.ShedAfter, aimd.ServedAfter, aimd.MeanLimit)
}

// After kill -9 and a restart on the same store, every acknowledged consume
// is on record: sent again with its request id, none charges again.
func TestCrashLosesNoAcknowledgedConsume(t *testing.T) {
	r, err := crashOnce(testContext(t), testEnv(t), 8, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Acked == 0 {
		t.Fatal("no consume was acknowledged before the kill")
	}
	if r.Lost != 0 {
		t.Errorf("%d of %d acknowledged consumes were lost across kill -9", r.Lost, r.Acked)
	}
	if r.OnRecord < int64(r.Acked) {
		t.Errorf("%d tokens on record after the restart, fewer than the %d acknowledged", r.OnRecord, r.Acked)
	}
	t.Logf("%d acknowledged, %d on record, %d on record unacknowledged", r.Acked, r.OnRecord, r.Unacked)
}

// Scenario 5 measures both kinds of call on a durable store, each round.
func TestDurableMeasuresConsumesAndNoops(t *testing.T) {
	e := testEnv(t)
	e.runs = 2
	r, err := durableOnce(testContext(t), e, "sqlite", 4, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Consumes) != 2 || len(r.Noops) != 2 {
		t.Fatalf("%d and %d rounds measured, want 2 of each", len(r.Consumes), len(r.Noops))
	}
	for i := range r.Consumes {
		if r.Consumes[i] <= 0 || r.Noops[i] <= 0 {
			t.Errorf("round %d: %.0f consumes/s and %.0f no-op calls/s, want both measured", i, r.Consumes[i], r.Noops[i])
		}
	}
	if r.Ratio <= 0 {
		t.Errorf("ratio %v", r.Ratio)
	}
}

// Scenario 7: plain HTTP clients behind governor-proxy never put more
// calls on the downstream than its capacity, so it refuses none.
func TestSidecarFanoutPeakWithinCapacity(t *testing.T) {
	e := testEnv(t)
	p := fanoutWorkload(true)
	with, _, err := sidecarFanoutGoverned(testContext(t), e, p)
	if err != nil {
		t.Fatal(err)
	}
	if with.Peak > p.Capacity {
		t.Errorf("through governor-proxy the downstream's peak concurrency is %d, over its capacity %d", with.Peak, p.Capacity)
	}
	if n := with.Overloaded["busy"] + with.Overloaded["quiet"]; n > 0 {
		t.Errorf("the downstream refused %d calls for overload through governor-proxy, want none", n)
	}
	if with.Calls["quiet"] == 0 || with.Calls["busy"] == 0 {
		t.Errorf("calls by tenant %v: both tenants should reach the downstream", with.Calls)
	}
}

// govbench plot draws every figure from a run's JSON, and says which JSON
// it could not use.
func TestPlotDrawsEveryFigure(t *testing.T) {
	in := t.TempDir()
	write := func(name string, raw any) {
		b, err := json.Marshal(result{Raw: raw})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(in, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	side := func(governed bool) *fanoutSide {
		return &fanoutSide{Governor: governed, Concurrency: [][2]float64{{0, 1}, {5, 12}, {9, 0}},
			LatencyMs: map[string][]float64{"busy": {40, 90}, "quiet": {20, 25}}}
	}
	write("fanout.json", map[string]any{"params": fanoutWorkload(true), "without": side(false), "with": side(true)})
	write("adaptive.json", map[string]any{"params": adaptiveWorkload(true),
		"fixed":    adaptiveSide{Limit: [][2]float64{{0, 20}, {2000, 20}}},
		"adaptive": adaptiveSide{Adaptive: true, Limit: [][2]float64{{0, 20}, {1100, 9}, {2000, 5}}}})
	write("durable.json", []durableRun{{Store: "sqlite", Callers: 1, Consumes: []float64{100}, Noops: []float64{900}},
		{Store: "sqlite", Callers: 16, Consumes: []float64{700}, Noops: []float64{4000}}})
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plot", "-in", in, "-out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("govbench plot exited %d: %s", code, stderr.String())
	}
	for _, name := range []string{"fanout-concurrency.png", "fanout-latency.png", "adaptive-limit.png", "durable-throughput.png"} {
		f, err := os.Open(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(f); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		f.Close()
	}
	os.Remove(filepath.Join(in, "durable.json"))
	stderr.Reset()
	if code := run([]string{"plot", "-in", in, "-out", out}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "no durable.json") {
		t.Errorf("without durable.json: exit %d, %q; want 0 and a note that names it", code, stderr.String())
	}
}
