package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// headersProxy starts governord with the tenant's quotas and modes and a
// sidecar whose rules charge 1 of a resource per GET /RESOURCE, with the
// RateLimit headers on; delegation and rule modes as yaml adds.
func headersProxy(t *testing.T, quotas map[string]int64, modes map[string]engine.CapMode, yaml string) (*server.Server, *testProxy, string) {
	t.Helper()
	g := startGovernord(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas, c.Tenants[0].QuotaModes = quotas, modes })
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], ratelimit_headers: true}\n" + yaml})
	return g, p, hostURL(o, "origin.test")
}

// The RateLimit header says the budget as a caller can use it: the units
// the sidecar has reserved and not spent are left for its callers, not
// used. After each request r is the cap less what the requests spent,
// while governord counts the sidecar's whole reservation against the cap
// (with a linger of an hour, nothing goes back meanwhile).
func TestRateLimitLeavesTheSidecarsUnspentReservation(t *testing.T) {
	g, p, base := headersProxy(t, map[string]int64{"writes": 100}, nil,
		"delegation: {enabled: true, linger: 1h}\nrules:\n  - {name: writes, match: {host: origin.test, path: /writes}, charge: {writes: 1}}\n")
	a := newAdmin(t, g.Addr())
	for i := 1; i <= 6; i++ {
		code, denied, h := get(t, p, base, "/writes")
		if code != 200 {
			t.Fatalf("request %d: %d %q", i, code, denied)
		}
		if got, want := h.Get(httpproxy.HeaderRateLimit), fmt.Sprintf(`"writes@payments";r=%d`, 100-i); got != want {
			t.Errorf("after %d requests: RateLimit %q, want %q", i, got, want)
		}
		if i == 1 {
			rep, err := a.c.Raw().GetCapStatus(context.Background(), &governorpb.GetCapStatusRequest{NodeId: a.node("payments").GetId()})
			if err != nil {
				t.Fatal(err)
			}
			if used := rep.GetCaps()[0].GetUsed(); used <= 1 {
				t.Fatalf("governord counts %d of writes after one request: no reservation held beyond it, the test shows nothing", used)
			}
		}
	}
}

// Governor-Warning names a cap over the request itself: a request that
// charges wc, whose soft cap it has gone past, is warned of wc, not of a
// cap on sc, another resource, that is spent; and while wc is within, it
// gets no warning at all.
func TestGovernorWarningNamesTheRequestsOwnCap(t *testing.T) {
	_, p, base := headersProxy(t, map[string]int64{"wc": 10, "sc": 2}, map[string]engine.CapMode{"wc": {Mode: engine.ModeSoft, Burst: 5}},
		"delegation: {enabled: false}\nrules:\n"+
			"  - {name: wc, match: {host: origin.test, path: /wc}, charge: {wc: 1}}\n"+
			"  - {name: sc, match: {host: origin.test, path: /sc}, charge: {sc: 1}}\n")
	for i := 1; i <= 2; i++ {
		if code, denied, _ := get(t, p, base, "/sc"); code != 200 {
			t.Fatalf("sc request %d: %d %q", i, code, denied)
		}
	}
	for i := 1; i <= 11; i++ {
		code, denied, h := get(t, p, base, "/wc")
		if code != 200 {
			t.Fatalf("wc request %d: %d %q", i, code, denied)
		}
		warning := h.Get(httpproxy.HeaderWarning)
		switch {
		case i < 8 && warning != "":
			t.Errorf("wc request %d (%d of 10, within): Governor-Warning %q, want none", i, i, warning)
		case i == 11 && !strings.HasPrefix(warning, `soft_exceeded; quota="wc"; node="payments"; used=11; cap=10`):
			t.Errorf("wc request 11 (past its soft cap of 10): Governor-Warning %q, want soft_exceeded on wc", warning)
		}
		if strings.Contains(warning, `"sc"`) {
			t.Errorf("wc request %d is warned of sc, which it does not charge: %q", i, warning)
		}
	}
}

// A rule in shadow charges nothing, so the real quota never moves; its
// RateLimit header says what enforcing the rule would meet: the shadow
// ledger counts as spent, and once it has spent the quota r is 0 and the
// warning says the cap refuses, as enforcement would.
func TestRateLimitOfAShadowRuleCountsItsLedger(t *testing.T) {
	_, p, base := headersProxy(t, map[string]int64{"calls": 3}, nil,
		"rules:\n  - {name: calls, match: {host: origin.test, path: /calls}, charge: {calls: 1}, mode: shadow}\n")
	for i := 1; i <= 5; i++ {
		code, denied, h := get(t, p, base, "/calls")
		if code != 200 {
			t.Fatalf("shadow request %d: %d %q; a shadow rule never refuses", i, code, denied)
		}
		if got, want := h.Get(httpproxy.HeaderRateLimit), `"calls@payments";r=`+strconv.Itoa(max(3-i, 0)); got != want {
			t.Errorf("shadow request %d: RateLimit %q, want %q", i, got, want)
		}
		if w := h.Get(httpproxy.HeaderWarning); i >= 3 && !strings.HasPrefix(w, `hard_exceeded; quota="calls"; node="payments"; used=3; cap=3`) {
			t.Errorf("shadow request %d: Governor-Warning %q, want hard_exceeded on calls", i, w)
		}
	}
}
