package proxy

import (
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/faultproxy"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server/serverconfig"
)

// A shadow rule's dry run whose answer is lost on the way back (the fault
// proxy cuts the connection as governord's answer arrives, after governord
// recorded it) is sent again under the same request id: every request is
// answered, and the shadow ledger counts each exactly once, so a quota of
// 3 is would-be refused from the 4th request on, as it would be enforced.
func TestShadowLedgerCountsALostAnswerOnce(t *testing.T) {
	g := startGovernord(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"calls": 3} })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	fp := faultproxy.New(ln, g.Addr())
	t.Cleanup(func() { fp.Close() })
	o := origin(t, http.HandlerFunc(hello), false, false)
	// Delegation off and a long TTL: the sidecar's only calls are then the
	// dry runs, so the next call after DropNextAnswer is the request's.
	p := startProxy(t, proxyOpts{gaddr: fp.Addr(),
		yaml: "mode: shadow\ndelegation: {enabled: false}\nrules:\n  - {name: api, match: {host: origin.test}, class: api, charge: {calls: 1}}\n",
		opts: func(o *Options) { o.GovernorOptions = append(o.GovernorOptions, governor.WithTTL(time.Minute)) }})
	base := hostURL(o, "origin.test")
	const requests = 5
	var refused []int // which requests shadow would have refused
	for i := range requests {
		fp.DropNextAnswer()
		before := p.metric(`governor_proxy_shadow_denials_total{cause="quota",rule="api"}`)
		if code, cause, _ := get(t, p, base, "/"); code != 200 {
			t.Fatalf("request %d: %d %q; a shadow rule forwards every request", i+1, code, cause)
		}
		if dropped := fp.AnswersDropped(); dropped != i+1 {
			t.Fatalf("after request %d the fault proxy dropped %d answers: the dry run's was not lost", i+1, dropped)
		}
		if p.metric(`governor_proxy_shadow_denials_total{cause="quota",rule="api"}`) > before {
			refused = append(refused, i+1)
		}
	}
	if n := p.metric(`governor_proxy_shadow_denials_total{cause="unavailable",rule="api"}`); n != 0 {
		t.Errorf("%v dry runs went unanswered (counted as unavailable); each should have been sent again", n)
	}
	if want := []int{4, 5}; !slices.Equal(refused, want) {
		t.Errorf("shadow would have refused requests %v, want %v: the ledger counted a request more than once, or not at all", refused, want)
	}
	tenant := newAdmin(t, g.Addr()).node("payments")
	if got := tenant.GetShadow()["calls"]; got != 3 {
		t.Errorf("the shadow ledger holds %d calls, want 3: the 3 requests that fit, each once", got)
	}
	// governord answered every dry run twice: the answer lost, then the
	// retry's, which the request id made the remembered one.
	if n := govtest.Scrape(t, g.MetricsAddr(), `governor_calls_total{code="OK",method="DryRun"}`); n != 2*requests {
		t.Errorf("governord answered %v dry runs, want %d", n, 2*requests)
	}
}
