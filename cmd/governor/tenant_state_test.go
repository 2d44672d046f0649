package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
)

// A tenant's state shows wherever an operator looks during an incident:
// caps get on the tenant (and on a task below it) says the state, its
// reason, who set it and since when, in text and JSON; doctor finds it;
// top marks the tenant's row and says it in the panel. A resumed tenant is
// active again everywhere, and doctor is quiet about it.
func TestTenantStateShown(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if _, err := adminRPC(t, srv.Addr()).CreateNode(context.Background(), &governorpb.CreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "job"}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ verb, state, refused string }{
		{"suspend", "suspended", "all new work is refused"},
		{"read-only", "read_only", "new writes are refused"},
	} {
		before := time.Now().UTC().Truncate(time.Second)
		if code, out, errOut := gov(t, "tenant", "payments", c.verb, "-reason", "incident 42"); code != 0 {
			t.Fatalf("tenant %s: exit %d\n%s%s", c.verb, code, out, errOut)
		}
		said := regexp.MustCompile(regexp.QuoteMeta(c.state) + ` by admin since (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC \((\d+[hms])+ ago\): "incident 42"; ` +
			regexp.QuoteMeta(c.refused))
		since := func(what, text string) {
			t.Helper()
			m := said.FindStringSubmatch(text)
			if m == nil {
				t.Fatalf("%s does not say %q:\n%s", what, said, text)
			}
			at, err := time.Parse(time.DateTime, m[1])
			if err != nil || at.Before(before) || at.After(time.Now()) {
				t.Fatalf("%s: since %s, want the change's time (after %v)", what, m[1], before)
			}
		}

		code, out, errOut := gov(t, "caps", "get", "payments")
		if code != 0 || !strings.HasPrefix(out, "payments  (id 2, tenant, open)\nstate: ") {
			t.Fatalf("caps get payments: exit %d\n%s%s", code, out, errOut)
		}
		since("caps get payments", out)
		_, out, _ = gov(t, "caps", "get", "payments/job")
		if !strings.Contains(out, "\ntenant payments: "+c.state+" by admin") {
			t.Fatalf("caps get payments/job does not name its tenant's state:\n%s", out)
		}
		since("caps get payments/job", out)
		var doc struct {
			State       string
			TenantState struct {
				Tenant, State, Reason, By, Refuses string
				Since                              time.Time
			} `json:"tenant_state"`
		}
		_, js, _ := gov(t, "caps", "get", "-json", "payments")
		if err := json.Unmarshal([]byte(js), &doc); err != nil {
			t.Fatalf("caps get -json: %v\n%s", err, js)
		}
		if ts := doc.TenantState; doc.State != "open" || ts.Tenant != "payments" || ts.State != c.state || ts.Reason != "incident 42" ||
			ts.By != "admin" || ts.Since.Before(before) || !strings.HasPrefix(c.refused, ts.Refuses) || ts.Refuses == "" {
			t.Fatalf("caps get -json: %+v\n%s", doc, js)
		}

		code, out, _ = gov(t, "doctor")
		if code != 1 || !strings.Contains(out, "WARN  tenants      payments: "+c.state+" by admin since") ||
			!strings.Contains(out, "fix: when it is no longer wanted: governor tenant payments resume -reason") {
			t.Fatalf("doctor on a %s tenant: exit %d\n%s", c.state, code, out)
		}
		since("doctor", out)

		t.Run("top "+c.verb, func(t *testing.T) {
			s := startTop(t, srv.Addr(), govtest.AdminKey, "-root", "payments")
			screen := s.waitFor("the tenant's state", "payments ["+c.state+"]", "state: "+c.state+" by admin since")
			since("top", screen)
			s.quit()
		})
	}

	if code, out, errOut := gov(t, "tenant", "payments", "resume", "-reason", "resolved"); code != 0 {
		t.Fatalf("tenant resume: exit %d\n%s%s", code, out, errOut)
	}
	_, out, _ := gov(t, "caps", "get", "payments")
	if !regexp.MustCompile(`\nstate: active by admin since [-0-9: ]+ UTC \((\d+[hms])+ ago\): "resolved"\n`).MatchString(out) {
		t.Fatalf("caps get after the resume:\n%s", out)
	}
	if _, out, _ := gov(t, "caps", "get", "payments/job"); strings.Contains(out, "tenant payments:") {
		t.Fatalf("caps get payments/job names an active tenant's state:\n%s", out)
	}
	if code, out, _ := gov(t, "doctor"); code != 0 || strings.Contains(out, "tenants") {
		t.Fatalf("doctor after the resume: exit %d\n%s", code, out)
	}
}
