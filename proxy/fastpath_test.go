package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/governor-project/governor/proxy/admission"
)

// Both sides get the admitter's fast path: once a budget is in hand, a
// request is admitted at once, with no wait and no call, on the HTTP side
// and through the pgwire listeners' gate alike. A wrapper that hid
// admission.Fast from either side would send every request the slow way.
func TestBothSidesTakeTheFastPath(t *testing.T) {
	srv := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: `
task: {name: pod-7, quotas: {calls: 1000}}
pgwire:
  - {listen: 127.0.0.1:0, upstream: 127.0.0.1:1}
rules:
  - {name: any, class: api, charge: {calls: 1}}
`})
	if len(p.pg) != 1 {
		t.Fatalf("%d pgwire listeners", len(p.pg))
	}
	for side, adm := range map[string]admission.Admitter{"http": p.http.Admitter, "pgwire": p.pg[0].proxy.Admitter} {
		f, ok := adm.(admission.Fast)
		if !ok {
			t.Errorf("%s: the admitter (%T) hides the fast path", side, adm)
			continue
		}
		r := admission.Request{Class: "api", Charges: map[string]int64{"calls": 1}}
		// The first admission brings the block and the reservation in.
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		tk, err := adm.Admit(ctx, r)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", side, err)
		}
		tk.End(time.Millisecond, false)
		eventually(t, side+"'s fast path", func() bool {
			tk, ok := f.TryAdmit(r)
			if ok {
				tk.End(time.Millisecond, false)
			}
			return ok
		})
	}
	if v := p.metric("governor_proxy_pgwire_transactions_open"); v != 0 {
		t.Errorf("%v pgwire transactions open after every ticket ended", v)
	}
}
