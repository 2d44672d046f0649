package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestSidecarServesAcrossAFailover: a sidecar given both governords'
// addresses keeps admitting requests while the leader stops and a standby
// takes over (from its delegated budgets meanwhile, then at the new
// leader), with the same session.
func TestSidecarServesAcrossAFailover(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_sidecar_ha_")
	ha := func(c *serverconfig.Config) {
		c.Store = serverconfig.StoreConfig{Driver: "postgres", DSN: dsn}
		c.HA = serverconfig.HAConfig{Enabled: true, Lease: time.Second, DriftAllowance: 100 * time.Millisecond}
		c.SessionTTL = 10 * time.Second
	}
	a := startGovernord(t, ha)
	<-a.Leading()
	b := startGovernord(t, ha)
	m := &meter{}
	o := originURL(t, m)
	p := startProxy(t, proxyOpts{gaddr: a.Addr() + "," + b.Addr(),
		yaml: "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api, charge: {calls: 1}}\n"})
	c := p.client("", nil)
	get := func() int {
		resp, err := c.Get(o + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 20 {
		if code := get(); code != 200 {
			t.Fatalf("before the failover: %d", code)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	served := 0
	for {
		if code := get(); code != 200 {
			t.Fatalf("request %d after the leader stopped: %d", served+1, code)
		}
		served++
		select {
		case <-b.Leading():
		default:
			continue
		}
		break
	}
	// Some more at the new leader, whose budgets the sidecar now draws on.
	for range 200 {
		if code := get(); code != 200 {
			t.Fatalf("after the takeover: %d", code)
		}
	}
	t.Logf("%d requests admitted while the standby took over", served)
}

// Two governord processes with ha on over one PostgreSQL, two governor-proxy
// processes listing both (one with delegated budgets, one without), a root
// limit of 2 on a class of 0.5 s requests and 8 clients keeping it
// contended: the leader is killed with SIGKILL while requests wait in its
// queue. Every request, those that waited at the kill and those that came
// during the failover, gets 200 once the standby leads, within its wait,
// and the origin never serves more than 2 at once. The sidecars' wait
// timeout is the default, 30 s: a request that waited across a failover
// has most of it left.
func TestWaitersSurviveAFailover(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_sidecar_failover_")
	// The quota binds nothing; its charge has the delegating sidecar top
	// its reservation up across the failover too.
	yaml := "session_ttl: 10s\nroot: {limits: {api: 2}}\ntenants:\n  - {name: payments, api_key: " + tenantKey + ", quotas: {calls: 100000}}\n"
	// ha's default lease and drift allowance, as the issue ran them: a
	// failover takes about 2 s, longer than the sidecar's retry of an
	// unreachable governord (budget.DefaultUnavailableRetry).
	leader := startHAGovProc(t, dsn, serverconfig.DefaultHALease, serverconfig.DefaultHADriftAllowance, yaml)
	eventually(t, "the first governord to lead", func() bool { return ready(leader.metrics) })
	standby := startHAGovProc(t, dsn, serverconfig.DefaultHALease, serverconfig.DefaultHADriftAllowance, yaml)
	addrs := leader.addr + "," + standby.addr

	m := &meter{delay: 500 * time.Millisecond}
	o := originURL(t, m)
	rules := "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api, charge: {calls: 1}}\n"
	sidecars := []*sidecarProc{
		startSidecarProcAt(t, addrs, tenantKey, "pod-a", rules),
		startSidecarProcAt(t, addrs, tenantKey, "pod-b", "delegation: {enabled: false}\n"+rules),
	}

	var (
		mu      sync.Mutex
		results []failoverResult
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const clients = 8
	for w := range clients {
		s := sidecars[w%2]
		// Longer than the wait timeout: the sidecar's answer is judged,
		// not the client's patience.
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: s.http})},
			Timeout: proxyconfig.DefaultWaitTimeout + 10*time.Second}
		t.Cleanup(c.CloseIdleConnections)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				began := time.Now()
				code, denied := 0, ""
				resp, err := c.Get(o + "/")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code, denied = resp.StatusCode, resp.Header.Get(httpproxy.HeaderDenied)
				}
				mu.Lock()
				results = append(results, failoverResult{client: w, sidecar: w % 2, began: began, ended: time.Now(), code: code, denied: denied, err: err})
				mu.Unlock()
			}
		})
	}
	// Kill the leader only once requests queue in it: they are what a
	// failover must not fail.
	var waiting float64
	eventually(t, "requests to queue at the leader", func() bool {
		waiting = scrape(t, leader.metrics, "governor_acquires_waiting")
		return waiting >= 4
	})
	killed := time.Now()
	leader.kill()
	eventually(t, "the standby to lead", func() bool { return ready(standby.metrics) })
	leads := time.Since(killed)
	// Then until every client has had an answer to a request it sent after
	// the kill: the one it was waiting on at the kill has been answered.
	// Within the wait timeout each must have been, one way or another.
	for deadline := time.Now().Add(proxyconfig.DefaultWaitTimeout); ; {
		mu.Lock()
		answered := map[int]bool{}
		for _, r := range results {
			if r.began.After(killed) {
				answered[r.client] = true
			}
		}
		mu.Unlock()
		if len(answered) == clients {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of %d clients had no answer to a request sent after the kill within %v of it", clients-len(answered), clients, proxyconfig.DefaultWaitTimeout)
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the clients' answers
	}
	close(stop)
	wg.Wait()

	served, peak, _ := m.stats()
	var failed []string
	spanning, last, firstAdmitted := 0, time.Duration(0), time.Duration(0)
	for _, r := range results {
		if r.ended.After(killed) && r.began.Before(killed) {
			spanning++
			last = max(last, r.ended.Sub(killed))
		}
		// Admitted when the origin began to serve it, its delay before
		// the answer; one admitted after the kill was admitted by the new
		// leader.
		if admitted := r.ended.Add(-m.delay).Sub(killed); r.code == 200 && admitted > 0 && (firstAdmitted == 0 || admitted < firstAdmitted) {
			firstAdmitted = admitted
		}
		if r.code != 200 {
			failed = append(failed, r.String(killed))
		}
	}
	t.Logf("%d requests (%d in flight at the kill, %v queued at the leader), %d served by the origin, at most %d at once; "+
		"after the kill the standby led at %v, admitted its first request at about %v, and the last request in flight at the kill ended at %v",
		len(results), spanning, waiting, served, peak, leads.Round(time.Millisecond), firstAdmitted.Round(time.Millisecond), last.Round(time.Millisecond))
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed:\n%s", len(failed), len(results), strings.Join(failed, "\n"))
	}
	if peak > 2 {
		t.Errorf("the origin served %d at once; the limit is 2", peak)
	}
	if spanning < 4 {
		t.Errorf("only %d requests were in flight at the kill: the failover was not tested", spanning)
	}
	// A release lost in the failover would hold its slot until the
	// session ends: the limit would stay full for everyone after.
	for i, s := range sidecars {
		if n := s.metric(t, "governor_proxy_release_failures_total"); n != 0 {
			t.Errorf("sidecar %d: %v releases failed", i, n)
		}
	}
}

// failoverResult is one request of TestWaitersSurviveAFailover.
type failoverResult struct {
	client       int
	sidecar      int
	began, ended time.Time
	code         int
	denied       string // Governor-Denied
	err          error
}

func (r failoverResult) String(killed time.Time) string {
	return fmt.Sprintf("  sidecar %d: %d %q %v: sent %v and answered %v after the kill (waited %v)", r.sidecar, r.code, r.denied, r.err,
		r.began.Sub(killed).Round(time.Millisecond), r.ended.Sub(killed).Round(time.Millisecond), r.ended.Sub(r.began).Round(time.Millisecond))
}
