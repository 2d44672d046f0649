package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/govtest"
)

// governor caps set sets a quota's period, caps get shows when it resets,
// and a period the CLI cannot read exits 2 before any call.
func TestCapsSetAndGetAPeriod(t *testing.T) {
	srv := startDurable(t, filepath.Join(t.TempDir(), "governor.db"))
	t.Cleanup(func() { srv.Close() })
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	for _, bad := range []string{"period.tokens=fortnight", "period.tokens=0s", "period.tokens=-1s", "period.tokens=500ms",
		"period.tokens=9223372036854775807ns", "period.tokens=8809h", "period.tokens=", "period=day", "default_period.tokens=year"} {
		if code, _, errOut := cli(t, "caps", "set", "payments", bad, "-reason", "r"); code != 2 || !strings.Contains(errOut, "period") {
			t.Errorf("caps set %s: exit %d, %q; want 2 naming the period", bad, code, errOut)
		}
	}
	code, out, errOut := cli(t, "caps", "set", "payments", "quota.tokens=500", "period.tokens=10s", "-reason", "a budget a window")
	if code != 0 || !strings.Contains(out, "period.tokens: none -> 10s") {
		t.Fatalf("caps set: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, "caps", "get", "payments")
	if code != 0 || !strings.Contains(out, "periods (used counts since the last reset):") || !strings.Contains(out, "tokens  10s  resets at ") {
		t.Fatalf("caps get: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = cli(t, "caps", "get", "-json", "payments")
	var got struct{ Periods []periodLine }
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Periods) != 1 || got.Periods[0].Period != "10s" ||
		got.Periods[0].ResetAt.Sub(time.Now()) > 10*time.Second || got.Periods[0].ResetAt.Before(time.Now().Add(-time.Second)) {
		t.Fatalf("caps get -json: %v %+v\n%s", err, got, out)
	}
	code, out, _ = cli(t, "caps", "set", "payments", "period.tokens=none", "-reason", "a budget for good")
	if code != 0 || !strings.Contains(out, "period.tokens: 10s -> none") {
		t.Fatalf("removing the period: exit %d: %s", code, out)
	}
}
