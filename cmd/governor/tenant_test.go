package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
)

// governor tenant suspends and resumes a tenant with a reason: the
// tenant's work is refused meanwhile, the audit trail shows the change,
// and only the admin key may make it.
func TestTenantCommand(t *testing.T) {
	for _, args := range [][]string{{"tenant"}, {"tenant", "payments"}, {"tenant", "payments", "freeze", "-reason", "r"},
		{"tenant", "payments", "suspend"}, {"tenant", "payments", "suspend", "-reason", " "}} {
		if code, out, errOut := cli(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s%s", args, code, out, errOut)
		}
	}
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	if code, _, errOut := cli(t, "tenant", "payments", "suspend", "-reason", "self"); code != 1 || !strings.Contains(errOut, "cannot edit its own scope node") {
		t.Fatalf("a tenant suspending itself: exit %d, %s", code, errOut)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	code, out, errOut := cli(t, "tenant", "payments", "suspend", "-reason", "incident 4")
	if code != 0 || out != "payments: active -> suspended\n" {
		t.Fatalf("suspend: exit %d\n%s%s", code, out, errOut)
	}
	c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _, err = c.NewTask(context.Background(), governor.Spec{Name: "job"})
	var te *governor.TenantStateError
	if !errors.As(err, &te) || te.State != "suspended" || te.Reason != "incident 4" {
		t.Fatalf("a new task while suspended: %v", err)
	}
	_, out, _ = cli(t, "caps", "history", "payments")
	if !strings.Contains(out, "state: active -> suspended") || !strings.Contains(out, "incident 4") {
		t.Fatalf("caps history after the suspension:\n%s", out)
	}
	if code, out, errOut := cli(t, "tenant", "payments", "resume", "-reason", "resolved"); code != 0 || out != "payments: suspended -> active\n" {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
	}
	if _, task, err := c.NewTask(context.Background(), governor.Spec{Name: "job"}); err != nil {
		t.Fatalf("a new task after resuming: %v", err)
	} else {
		task.Close()
	}
}
