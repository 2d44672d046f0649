package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/httpproxy"
)

// Delegated budgets across sidecars, through real governor-proxy processes
// and a real governord process: caps hold exactly, the fair queue holds
// under contention, capacity moves between sidecars promptly, and nothing
// is lost when a sidecar dies or governord restarts.

// Two sidecars of one tenant share a tenant quota of 200. Of 600 requests,
// 8 at a time, exactly 200 are admitted and 400 get 429 quota.
func TestExactQuotaAcrossSidecarsHTTP(t *testing.T) {
	g := startGovProc(t, "tenants:\n  - {name: payments, api_key: "+tenantKey+", quotas: {calls: 200}}\n")
	m := &meter{}
	o := originURL(t, m)
	rules := "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api, charge: {calls: 1}}\n"
	sidecars := []*sidecarProc{startSidecarProc(t, g, tenantKey, "pod-a", rules), startSidecarProc(t, g, tenantKey, "pod-b", rules)}
	var ok, quota, other atomic.Int64
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := range 8 {
		c := sidecars[w%2].client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= 600 {
				resp, err := c.Get(o + "/")
				if err != nil {
					other.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 200:
					ok.Add(1)
				case resp.StatusCode == 429 && resp.Header.Get(httpproxy.HeaderDenied) == "quota":
					quota.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	served, _, _ := m.stats()
	if ok.Load() != 200 || quota.Load() != 400 || other.Load() != 0 || served != 200 {
		t.Errorf("600 requests against a quota of 200: %d admitted, %d denied quota, %d else; the origin served %d",
			ok.Load(), quota.Load(), other.Load(), served)
	}
}

// A quota is denied only when no other sidecar holds units of it unspent:
// one sidecar holds a reservation, idle (a long linger), while another
// spends; the second's first 429 comes when exactly the quota is spent.
func TestQuotaDeniedOnlyWhenNothingIsLeftAnywhere(t *testing.T) {
	g := startGovProc(t, "tenants:\n  - {name: payments, api_key: "+tenantKey+", quotas: {calls: 100}}\n")
	o := originURL(t, &meter{})
	rules := "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api, charge: {calls: 1}}\ndelegation: {linger: 1m}\n"
	holder, spender := startSidecarProc(t, g, tenantKey, "pod-a", rules), startSidecarProc(t, g, tenantKey, "pod-b", rules)
	get := func(c *http.Client) int {
		resp, err := c.Get(o + "/")
		must(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	hc := holder.client(t)
	for range 20 { // the holder's reservation grows past what it spends
		if code := get(hc); code != 200 {
			t.Fatalf("the holder's request: %d", code)
		}
	}
	if unspent := holder.metric(t, `governor_proxy_reserved_units{resource="calls",state="unspent"}`); unspent < 1 {
		t.Fatalf("the holder has %v units unspent; the test needs some", unspent)
	}
	sc := spender.client(t)
	admitted := 20
	for get(sc) == 200 {
		admitted++
		if admitted > 100 {
			t.Fatal("more than the quota admitted")
		}
	}
	if admitted != 100 {
		t.Errorf("the spender was first denied with %d of 100 admitted; the holder's unspent units were not recalled", admitted)
	}
}

// The same through pgwire: 600 inserts, each charging one db_writes of a
// tenant quota of 200, from two sidecars: exactly 200 rows.
func TestExactQuotaAcrossSidecarsPGWire(t *testing.T) {
	up := pgUpstream(t)
	freshPGTable(t, "pgq_exact")
	g := startGovProc(t, "tenants:\n  - {name: payments, api_key: "+tenantKey+", quotas: {db_writes: 200}}\n")
	yaml := fmt.Sprintf("pgwire:\n  - {listen: PG, upstream: %s}\nrules:\n  - {name: writes, match: {sql: [insert], tables: [pgq_exact]}, class: db, charge: {db_writes: 1}}\n", up)
	sidecars := []*sidecarProc{startSidecarProc(t, g, tenantKey, "pod-a", yaml), startSidecarProc(t, g, tenantKey, "pod-b", yaml)}
	var ok, quota, other atomic.Int64
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := range 8 {
		c := pgConnect(t, pgDSN(sidecars[w%2].pg, ""))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= 600; i = next.Add(1) {
				_, err := c.Exec(context.Background(), "INSERT INTO pgq_exact VALUES ($1)", i)
				var pe *pgconn.PgError
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &pe) && pe.Code == "53400":
					quota.Add(1)
				default:
					t.Errorf("insert %d: %v", i, err)
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if rows := pgRows(t, "pgq_exact"); ok.Load() != 200 || quota.Load() != 400 || rows != 200 {
		t.Errorf("600 inserts against a quota of 200: %d admitted, %d denied (53400), %d else; %d rows",
			ok.Load(), quota.Load(), other.Load(), rows)
	}
}

// A root limit of 2 holds across two sidecars under load: at the origin,
// and in pg_stat_activity.
func TestLimitsAcrossSidecars(t *testing.T) {
	up := os.Getenv("GOVERNOR_TEST_PG_DSN")
	g := startGovProc(t, "root:\n  limits: {api: 2, db: 2}\ntenants:\n  - {name: payments, api_key: "+tenantKey+"}\n")
	m := &meter{delay: 20 * time.Millisecond}
	o := originURL(t, m)
	yaml := "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api}\n  - {name: sql, match: {sql: any}, class: db}\n"
	if up != "" {
		yaml = fmt.Sprintf("pgwire:\n  - {listen: PG, upstream: %s}\n", pgUpstream(t)) + yaml
	}
	sidecars := []*sidecarProc{startSidecarProc(t, g, tenantKey, "pod-a", yaml), startSidecarProc(t, g, tenantKey, "pod-b", yaml)}
	var wg sync.WaitGroup
	for w := range 8 {
		c := sidecars[w%2].client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				resp, err := c.Get(o + "/")
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	served, most, _ := m.stats()
	if served != 120 || most != 2 {
		t.Errorf("the origin served %d requests, at most %d at once; want 120, and 2 at once (the root's limit, reached)", served, most)
	}
	if up == "" {
		return
	}
	// pg_sleep through both sidecars; a direct connection watches how many
	// run at once.
	watch := pgConnect(t, up)
	stop := make(chan struct{})
	var mostPG atomic.Int64
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var n int64
			if err := watch.QueryRow(context.Background(),
				"SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(0.05)%' AND state = 'active'").Scan(&n); err != nil {
				t.Error(err)
				return
			}
			for cur := mostPG.Load(); n > cur && !mostPG.CompareAndSwap(cur, n); cur = mostPG.Load() {
			}
		}
	}()
	for w := range 6 {
		c := pgConnect(t, pgDSN(sidecars[w%2].pg, ""))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 6 {
				if _, err := c.Exec(context.Background(), "SELECT pg_sleep(0.05)", pgx.QueryExecModeSimpleProtocol); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-watched
	if n := mostPG.Load(); n != 2 {
		t.Errorf("at most %d statements ran at once in PostgreSQL; want 2 (the root's db limit, reached)", n)
	}
}

// Tenants of weights 3 and 1, each behind its own sidecar, flood a limit-4
// pool of 50 ms requests: their grants split about 3:1 (within ±25%).
func TestFairnessAcrossSidecars(t *testing.T) {
	g := startGovProc(t, `root:
  limits: {api: 4}
tenants:
  - {name: heavy, api_key: heavy-key-0123456789, weight: 3}
  - {name: light, api_key: light-key-0123456789, weight: 1}
`)
	m := &meter{delay: 50 * time.Millisecond}
	o := originURL(t, m)
	rules := "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api}\n"
	heavy := startSidecarProc(t, g, "heavy-key-0123456789", "pod-h", rules)
	light := startSidecarProc(t, g, "light-key-0123456789", "pod-l", rules)
	deadline := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	flood := func(s *sidecarProc, tenant string) {
		c := s.client(t)
		for range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					req, _ := http.NewRequest("GET", o+"/", nil)
					req.Header.Set("X-Tenant", tenant)
					resp, err := c.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
	}
	flood(heavy, "heavy")
	flood(light, "light")
	wg.Wait()
	_, most, by := m.stats()
	ratio := float64(by["heavy"]) / math.Max(1, float64(by["light"]))
	if ratio < 3*0.75 || ratio > 3*1.25 || most > 4 {
		t.Errorf("heavy %d, light %d: %.2f:1, want 3:1 ±25%%; at most %d at once (limit 4)", by["heavy"], by["light"], ratio, most)
	}
	t.Logf("heavy %d, light %d: %.2f:1; the heavy sidecar took %v slots from its block and %v single leases",
		by["heavy"], by["light"], ratio, heavy.metric(t, `governor_proxy_slot_grants_total{how="block"}`),
		heavy.metric(t, `governor_proxy_slot_grants_total{how="single"}`))
}

// After one sidecar's burst leaves its block full of idle slots, another
// tenant's first request is granted at once: governord's notice makes the
// holder give back an idle slot. Without the notice it would wait for the
// reminder governord sends each second, or for the minute's linger, so the
// bound is well under a second, and loose enough for a loaded machine.
func TestHandOffAcrossSidecars(t *testing.T) {
	g := startGovProc(t, `root:
  limits: {api: 4}
tenants:
  - {name: first, api_key: first-key-0123456789}
  - {name: second, api_key: second-key-0123456789}
`)
	m := &meter{}
	o := originURL(t, m)
	rules := "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api}\ndelegation: {linger: 1m}\n"
	first := startSidecarProc(t, g, "first-key-0123456789", "pod-1", rules)
	second := startSidecarProc(t, g, "second-key-0123456789", "pod-2", rules)
	m.setDelay(20 * time.Millisecond)
	var wg sync.WaitGroup
	c := first.client(t)
	for range 4 { // the pool's limit: its block fills, and nothing queues
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(o + "/")
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	m.setDelay(0)
	if idle := first.metric(t, `governor_proxy_slots{class="api",state="idle"}`); idle != 4 {
		t.Fatalf("after the burst the first sidecar holds %v idle slots, want all 4 (a linger of a minute)", idle)
	}
	c2 := second.client(t)
	for i := range 3 {
		began := time.Now()
		resp, err := c2.Get(o + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := time.Since(began)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if i == 0 && took > 400*time.Millisecond {
			t.Errorf("the second tenant's first request took %v, want well under the second of a reminder", took)
		}
		t.Logf("the second tenant's request %d took %v", i, took)
	}
}

// An origin whose latency jumps makes the adaptive limit fall, and the
// sidecars' blocks follow it down.
func TestAdaptiveLimitUnderDelegation(t *testing.T) {
	g := startGovProc(t, `adaptive:
  - {class: psp, target_p95: 100ms, max_overload: 0.5, min_limit: 1, max_limit: 8}
tenants:
  - {name: payments, api_key: `+tenantKey+`}
`)
	m := &meter{delay: 5 * time.Millisecond}
	o := originURL(t, m)
	rules := "rules:\n  - {name: psp, match: {host: 127.0.0.1}, class: psp}\n"
	sidecars := []*sidecarProc{startSidecarProc(t, g, tenantKey, "pod-a", rules), startSidecarProc(t, g, tenantKey, "pod-b", rules)}
	limit := func() float64 { return scrape(t, g.metrics, `governor_pool_limit{class="psp",tenant=""}`) }
	held := func() float64 { return scrape(t, g.metrics, `governor_pool_held{class="psp",tenant=""}`) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		c := sidecars[w%2].client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Get(o + "/")
				if err != nil {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	// Fast calls: the limit stays at its maximum. The controller cuts as
	// soon as an interval's samples are slow, so hundreds of fast calls
	// reported are what a wrong cut needs to show, not a span of time.
	servedSoFar := func() int { n, _, _ := m.stats(); return n }
	eventually(t, "400 fast calls", func() bool { return servedSoFar() >= 400 })
	if l := limit(); l != 8 {
		t.Errorf("with fast calls the limit is %v, want its maximum 8", l)
	}
	m.setDelay(300 * time.Millisecond)
	// Four cuts of the adaptive interval at least (8, 5, 3, 2), each on
	// samples the sidecars report: on a loaded machine, more than waitFor.
	govtest.Eventually(t, 3*waitFor, "the limit to fall to its minimum", func() bool { return limit() <= 2 })
	l := limit()
	eventually(t, "the blocks to follow it down", func() bool { return held() <= l })
	m.mu.Lock()
	m.max = 0
	m.mu.Unlock()
	// Calls of 300 ms, at most l at once: ten more calls served is a span
	// in which more than l at once would show.
	after := servedSoFar()
	govtest.Eventually(t, 3*waitFor, "ten more calls", func() bool { return servedSoFar() >= after+10 })
	if _, most, _ := m.stats(); float64(most) > l {
		t.Errorf("after the limit fell to %v, %d calls ran at once", l, most)
	}
}

// A sidecar killed with kill -9 while it holds a block: its slots come back
// when its session's TTL passes (plus the reaper's interval).
func TestKilledSidecarsSlotsComeBack(t *testing.T) {
	const ttl = time.Second
	g := startGovProc(t, fmt.Sprintf("session_ttl: %v\nroot:\n  limits: {api: 8}\ntenants:\n  - {name: payments, api_key: %s}\n", ttl, tenantKey))
	o := originURL(t, &meter{})
	s := startSidecarProc(t, g, tenantKey, "pod-k", "rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api}\ndelegation: {linger: 1m}\n")
	c := s.client(t)
	for range 3 {
		resp, err := c.Get(o + "/")
		must(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	held := func() float64 { return scrape(t, g.metrics, `governor_pool_held{class="api",tenant=""}`) }
	if h := held(); h < 1 {
		t.Fatalf("the sidecar holds %v slots before the kill", h)
	}
	killed := time.Now()
	s.proc.cmd.Process.Kill()
	<-s.proc.exited
	s.proc.exited <- nil
	for held() != 0 {
		time.Sleep(10 * time.Millisecond)
		if time.Since(killed) > 5*ttl {
			t.Fatal("the killed sidecar's slots never came back")
		}
	}
	// The TTL and the reaper's 100 ms bound when they come back; the
	// margin is for a loaded machine's scrapes, and far below the block's
	// linger of a minute, which is what a sidecar alive would keep them for.
	if d := time.Since(killed); d > ttl+100*time.Millisecond+time.Second {
		t.Errorf("the slots came back %v after the kill; the TTL is %v and the reaper runs every 100 ms", d, ttl)
	}
}

// governord restarts, down for a second: a sidecar whose delegated budget
// covers its load fails no request meanwhile.
func TestGovernordRestartWithinTheBudget(t *testing.T) {
	g := startGovProc(t, "root:\n  limits: {api: 16}\ntenants:\n  - {name: payments, api_key: "+tenantKey+", quotas: {calls: 1000000}}\n")
	o := originURL(t, &meter{})
	s := startSidecarProc(t, g, tenantKey, "pod-r", `rules:
  - {name: api, match: {host: 127.0.0.1}, class: api, charge: {calls: 1}}
delegation: {linger: 1m, max_reservation: 1000}
`)
	c := s.client(t)
	get := func() error {
		resp, err := c.Get(o + "/")
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%d %s", resp.StatusCode, resp.Header.Get(httpproxy.HeaderDenied))
		}
		return nil
	}
	// Warm the budget: a burst grows the block to 8 slots and the
	// reservation to hundreds of units, more than a second of the lighter
	// load below spends.
	var wg sync.WaitGroup
	run := func(workers int, pause time.Duration, until time.Time, failures, served *atomic.Int64) {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(until) {
					if err := get(); err != nil {
						failures.Add(1)
						t.Log(err)
					} else {
						served.Add(1)
					}
					time.Sleep(pause)
				}
			}()
		}
	}
	var warmFail, warm atomic.Int64
	run(8, 0, time.Now().Add(2*time.Second), &warmFail, &warm)
	wg.Wait()
	if warmFail.Load() != 0 {
		t.Fatalf("%d requests failed before the restart", warmFail.Load())
	}
	if units := s.metric(t, `governor_proxy_reserved_units{resource="calls",state="unspent"}`); units < 200 {
		t.Fatalf("the sidecar holds %v units unspent; the test needs a budget that covers a second of its load", units)
	}
	var fail, served atomic.Int64
	run(2, 20*time.Millisecond, time.Now().Add(3*time.Second), &fail, &served)
	eventually(t, "requests before the kill", func() bool { return served.Load() >= 10 })
	g.kill()
	time.Sleep(time.Second) // the outage under test, not a wait for readiness
	g.start()
	wg.Wait()
	if fail.Load() != 0 || served.Load() == 0 {
		t.Errorf("across a governord restart of 1 s, %d of %d requests failed", fail.Load(), fail.Load()+served.Load())
	}
}
