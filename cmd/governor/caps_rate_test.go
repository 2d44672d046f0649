package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
)

// governor caps set sets a rate (and its burst), caps get shows it with
// how full its bucket is, and a rate the CLI cannot read exits 2 before
// any call (the built command against a real governord).
func TestCapsSetAndGetARate(t *testing.T) {
	db := filepath.Join(t.TempDir(), "governor.db")
	srv := startDurable(t, db)
	ctx := context.Background()
	admin := adminRPC(t, srv.Addr())
	task, err := admin.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "crawl"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	for _, bad := range []string{"rate.calls=0/s", "rate.calls=-1/s", "rate.calls=abc", "rate.calls=1/fortnight",
		"rate.calls=99999999999999999999/s", "rate.calls=9007199254740993/s", "rate.calls=1/s:burst=0",
		"rate.calls=1/s:burst=-1", "rate.calls=1/s:brust=2", "rate.calls=1/25h", "rate=1/s"} {
		if code, _, errOut := cli(t, "caps", "set", "payments/crawl", bad, "-reason", "r"); code != 2 || !strings.Contains(errOut, "rate") {
			t.Errorf("caps set %s: exit %d, %q; want 2 naming the rate", bad, code, errOut)
		}
	}
	code, out, errOut := cli(t, "caps", "set", "payments/crawl", "rate.calls=2/min:burst=3", "default_rate.calls=10/s", "-reason", "provider limit")
	if code != 0 || !strings.Contains(out, "rate.calls: none -> 2/min (burst 3)") || !strings.Contains(out, "default_rate.calls: none -> 10/s") {
		t.Fatalf("caps set: exit %d: %s%s", code, out, errOut)
	}
	if _, err := admin.Consume(ctx, &governorpb.ConsumeRequest{NodeId: task.GetNode().GetId(), Resource: "calls", Amount: 2}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, "caps", "get", "payments/crawl")
	if code != 0 || !strings.Contains(out, "rates (left/burst):") || !strings.Contains(out, "calls  1/3  2/min  full in ") {
		t.Fatalf("caps get: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = cli(t, "caps", "get", "-json", "payments/crawl")
	var got struct {
		Rates []rateLine
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Rates) != 1 ||
		got.Rates[0] != (rateLine{Name: "calls", Rate: "2/min", Size: 3, Level: 1, FullIn: got.Rates[0].FullIn}) || got.Rates[0].FullIn <= 0 {
		t.Fatalf("caps get -json: %v %+v\n%s", err, got, out)
	}
	code, out, _ = cli(t, "caps", "set", "payments/crawl", "rate.calls=none", "-reason", "provider lifted it")
	if code != 0 || !strings.Contains(out, "rate.calls: 2/min (burst 3) -> none") {
		t.Fatalf("removing the rate: exit %d: %s", code, out)
	}
	// The audit trail has each rate change, with what it replaced, and
	// keeps it across a restart (the store replays the events).
	srv.Close()
	startDurable(t, db)
	code, out, errOut = cli(t, "caps", "history", "payments/crawl")
	for _, want := range []string{"provider limit", "rate.calls: none -> 2/min (burst 3)", "default_rate.calls: none -> 10/s",
		"provider lifted it", "rate.calls: 2/min (burst 3) -> none"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("caps history lacks %q: exit %d:\n%s%s", want, code, out, errOut)
		}
	}
}

// While a sidecar holds a slice of a rate, caps get says what the slice
// holds (units of the size and of the refill lent), and counts the
// slice's term in "full in": the bucket cannot fill before the term ends.
func TestCapsGetSaysWhatSlicesHold(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	ctx := context.Background()
	admin := adminRPC(t, srv.Addr())
	task, err := admin.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "crawl", Rates: map[string]*governorpb.Rate{"calls": {Units: 100, Per: durationpb.New(time.Second)}}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := admin.Reserve(ctx, &governorpb.ReserveRequest{NodeId: task.GetNode().GetId(), Resource: "calls", Want: 10})
	if err != nil || res.GetSliceId() == 0 {
		t.Fatalf("reserve: %v, %v; want a slice of the rate", res, err)
	}
	code, out, errOut := cli(t, "caps", "get", "payments/crawl")
	if code != 0 || !regexp.MustCompile(`calls  75/100  100/s  full in [34]\.\d+s, 25 and 25/s lent to 1 slice\n`).MatchString(out) {
		t.Fatalf("caps get: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = cli(t, "caps", "get", "-json", "payments/crawl")
	var got struct {
		Rates []rateLine
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Rates) != 1 ||
		got.Rates[0].Slices != 1 || got.Rates[0].Lent != 25 || got.Rates[0].LentRate != "25/s" || got.Rates[0].FullIn < 3*time.Second {
		t.Fatalf("caps get -json: %v %+v\n%s", err, got, out)
	}
}
