package proxy

import (
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// arrivals is an origin that records when each request arrived.
type arrivals struct {
	mu sync.Mutex
	at []time.Time
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.at = append(a.at, time.Now())
	a.mu.Unlock()
	io.WriteString(w, "ok")
}

// within returns the arrivals in [from, to), in order.
func (a *arrivals) within(from, to time.Time) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []time.Time
	for _, t := range a.at {
		if !t.Before(from) && t.Before(to) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(x, y time.Time) int { return x.Compare(y) })
	return out
}

// busiestSecond is the most arrivals in any one-second window, sliding
// over the arrival times (each window starts at an arrival).
func busiestSecond(at []time.Time) (int, time.Time) {
	most, when := 0, time.Time{}
	j := 0
	for i := range at {
		for j < len(at) && at[j].Sub(at[i]) < time.Second {
			j++
		}
		if j-i > most {
			most, when = j-i, at[i]
		}
	}
	return most, when
}

// TestFleetPacesARateExactly: two governor-proxy processes of one tenant,
// whose rate is 50 requests a second (burst 50), and 64 keep-alive clients
// (32 on each) looping GETs for 20s. The sidecars pace rather than refuse
// (wait_timeout 30s, so every wait fits): no client gets a 429. Each
// sidecar is delegated a slice of the rate while governord sees no
// contention (at the start), admitting from it with no call, and charges
// per request once the flood drains the shared bucket and the slices are
// not renewed; either way the fleet passes the rate in no window: the origin
// sees between 950 and 1,050 requests in the 20s, and at most 100 (rate
// plus burst) in any sliding second. Waiters are served in arrival order,
// so none waits much longer than the queue ahead of it takes.
func TestFleetPacesARateExactly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 20s")
	}
	const (
		rate, burst = 50, 50
		run         = 20 * time.Second
		perSidecar  = 32
	)
	g := startGovernord(t, func(c *serverconfig.Config) {
		c.Tenants[0].Rates = map[string]engine.Rate{"requests": {Units: rate, Per: int64(time.Second)}}
	})
	o := &arrivals{}
	target := originURL(t, o) + "/"
	yaml := `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], wait_timeout: 30s, shutdown_timeout: 2s}
rules:
  - {name: api, charge: {requests: 1}}
`
	sidecars := []*sidecarProc{
		startSidecarProcAt(t, g.Addr(), tenantKey, "pod-a", yaml),
		startSidecarProcAt(t, g.Addr(), tenantKey, "pod-b", yaml),
	}
	var statuses sync.Map // status -> *atomic.Int64
	count := func(code int) {
		n, _ := statuses.LoadOrStore(code, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	var slowest atomic.Int64 // the longest answer, in ns
	began := time.Now()
	stop := began.Add(run)
	var wg sync.WaitGroup
	for _, s := range sidecars {
		for range perSidecar {
			tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: s.http}), MaxIdleConnsPerHost: 1}
			t.Cleanup(tr.CloseIdleConnections)
			c := &http.Client{Transport: tr, Timeout: 40 * time.Second}
			wg.Go(func() {
				for time.Now().Before(stop) {
					sent := time.Now()
					resp, err := c.Get(target)
					if err != nil {
						count(-1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					count(resp.StatusCode)
					for took := int64(time.Since(sent)); ; {
						if old := slowest.Load(); took <= old || slowest.CompareAndSwap(old, took) {
							break
						}
					}
				}
			})
		}
	}
	wg.Wait()
	got := map[int]int64{}
	statuses.Range(func(k, v any) bool { got[k.(int)] = v.(*atomic.Int64).Load(); return true })
	at := o.within(began, stop)
	most, when := busiestSecond(at)
	paced := sidecars[0].metric(t, `governor_proxy_paced_total{resource="requests",status="admitted"}`) +
		sidecars[1].metric(t, `governor_proxy_paced_total{resource="requests",status="admitted"}`)
	sliced := sidecars[0].metric(t, `governor_proxy_rate_slice_admitted_total`) +
		sidecars[1].metric(t, `governor_proxy_rate_slice_admitted_total`)
	t.Logf("statuses %v; the origin saw %d in %v, at most %d in a second (from %v); %v paced, %v admitted from slices; the slowest answer took %v",
		got, len(at), run, most, when.Sub(began).Round(time.Millisecond), paced, sliced, time.Duration(slowest.Load()).Round(time.Millisecond))
	if sliced == 0 {
		t.Errorf("no request was admitted from a slice of the rate: the bounds were met by charges per request alone")
	}
	if n := len(at); n < rate*int(run/time.Second)-rate || n > rate*int(run/time.Second)+burst {
		t.Errorf("the origin saw %d requests in %v under %d/s (burst %d), want %d to %d",
			n, run, rate, burst, rate*int(run/time.Second)-rate, rate*int(run/time.Second)+burst)
	}
	if most > rate+burst {
		t.Errorf("%d requests in one second (from %v), past rate + burst = %d", most, when.Sub(began), rate+burst)
	}
	// Served in arrival order, a request waits for the 64 clients' requests
	// ahead of it at 50/s (about 1.3s, twice that when the two sidecars'
	// heads take turns); one that waits far longer was passed by newer ones.
	if d := time.Duration(slowest.Load()); d > 5*time.Second {
		t.Errorf("an answer took %v: a waiter starved while newer ones got through", d)
	}
	for code, n := range got {
		if code != 200 {
			t.Errorf("%d answers with status %d, want only 200 (every wait fits in wait_timeout)", n, code)
		}
	}
}
