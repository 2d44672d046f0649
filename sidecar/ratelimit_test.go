package sidecar

import (
	"net/http"
	"strings"
	"testing"

	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/sidecar/httpproxy"
)

// headersProxy starts governord with the tenant's quotas and modes and a
// sidecar whose rules charge 1 of a resource per GET /RESOURCE, with the
// RateLimit headers on; delegation and rule modes as yaml adds.
func headersProxy(t *testing.T, quotas map[string]int64, modes map[string]engine.CapMode, yaml string) (*server.Server, *testProxy, string) {
	t.Helper()
	g := startGovernord(t, func(c *server.Config) { c.Tenants[0].Quotas, c.Tenants[0].QuotaModes = quotas, modes })
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], ratelimit_headers: true}\n" + yaml})
	return g, p, hostURL(o, "origin.test")
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
