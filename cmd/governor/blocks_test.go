package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server/serverconfig"
)

// A block of slots delegated to a sidecar shows as what it is, in doctor,
// caps get and top: its slots, how many hold work at the sidecar (as the
// sidecar reports) and since when, and how many are idle. Doctor flags only
// work that has held a slot longer than -lease-age, not the block itself;
// once that work ends, the idle block is no finding at all. A full limit
// whose slots sit partly idle in blocks is said to be so.
func TestBlocksShownAsDelegated(t *testing.T) {
	buildCLI(t) // before the clock matters
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Limits = map[string]int64{"web": 2} })
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	admin := adminRPC(t, srv.Addr())
	origin := newHoldingOrigin(t)
	side, _ := startSidecar(t, fmt.Sprintf(`governor: {addr: %q, api_key: %s}
task: {name: pod-a}
metrics_listen: 127.0.0.1:0
http: {listen: 127.0.0.1:0, allow_targets: [%q]}
delegation: {enabled: true, linger: 1h}
routes:
  - {prefix: /up/, upstream: %q}
rules:
  - {name: web, match: {path: "/*"}, class: web}
`, srv.Addr(), govtest.TenantKey, strings.TrimPrefix(origin.URL, "http://"), origin.URL))
	client, base := viaSidecar(side)

	// Two requests hold a slot each; one ends: the block keeps 2 slots, 1
	// holding work and 1 idle (the linger is an hour).
	stuck, done := send(client, base, "/hold/stuck"), send(client, base, "/hold/done")
	const tenant = 2
	waitInspect(t, admin, tenant, "both slots in use", func(in *governorpb.Inspection) bool {
		b := blockOf(in, "web")
		return b != nil && b.GetInUse() == 2
	})
	origin.release("done")
	if code := <-done; code != 200 {
		t.Fatalf("the request that ended: %d", code)
	}
	in := waitInspect(t, admin, tenant, "1 slot in use, 1 idle", func(in *governorpb.Inspection) bool {
		b := blockOf(in, "web")
		return b != nil && b.GetCount() == 2 && b.GetInUse() == 1 && b.GetInUseSince() != nil
	})
	block := blockOf(in, "web")
	// The stuck request's slot has been held for more than -lease-age.
	<-time.After(time.Until(block.GetInUseSince().AsTime().Add(1100 * time.Millisecond)))

	code, out, errOut := gov(t, "doctor", "-lease-age", "1s")
	wantStuck := regexp.MustCompile(fmt.Sprintf(`WARN  leases       payments/pod-a: block %d of web, session %d: 2 slots delegated; 1 in use \(for \d+s\), 1 idle: `+
		`work has held a slot longer than 1s\n`, block.GetId(), block.GetSessionId()))
	if code != 1 || !wantStuck.MatchString(out) || strings.Count(out, "WARN  leases") != 1 {
		t.Errorf("doctor with one request stuck in a block: exit %d; want one leases warning matching %s\n%s%s", code, wantStuck, out, errOut)
	}
	if strings.Contains(out, fmt.Sprintf("lease %d of web held by session", block.GetId())) {
		t.Errorf("doctor calls the block a lease held by work:\n%s", out)
	}
	if !strings.Contains(out, "OK    pools        payments: limit web is full (2/2): 2 delegated (1 in use, 1 idle); the idle slots go back to governord as soon as anyone waits for web") {
		t.Errorf("doctor does not say how the full limit is held:\n%s", out)
	}
	_, out, _ = gov(t, "caps", "get", "payments")
	if !regexp.MustCompile(`\n  web\s+2/2\s+\[#+\]\s+2 delegated \(1 in use, 1 idle\)\n`).MatchString(out) {
		t.Errorf("caps get payments does not say how web's slots are held:\n%s", out)
	}
	t.Run("top", func(t *testing.T) {
		s := startTop(t, srv.Addr(), govtest.AdminKey, "-root", "payments")
		s.waitFor("the block", "held: 2 delegated (1 in use, 1 idle)",
			fmt.Sprintf("block %d of web, session %d: 2 slots delegated; 1 in use (for", block.GetId(), block.GetSessionId()))
		s.quit()
	})

	// The stuck request ends: the block is idle, which is no finding.
	origin.release("stuck")
	if code := <-stuck; code != 200 {
		t.Fatalf("the stuck request: %d", code)
	}
	waitInspect(t, admin, tenant, "the block idle", func(in *governorpb.Inspection) bool {
		b := blockOf(in, "web")
		return b != nil && b.GetCount() == 2 && b.GetUseReported() != nil && b.GetInUse() == 0
	})
	code, out, _ = gov(t, "doctor", "-lease-age", "1s")
	if code != 0 || strings.Contains(out, "WARN") || !strings.Contains(out, "holding 2 delegated (0 in use, 2 idle)") {
		t.Errorf("doctor with the block idle: exit %d, want no finding\n%s", code, out)
	}
}
