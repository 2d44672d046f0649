package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// byPath is an origin that records when each request arrived, by path.
type byPath struct {
	mu sync.Mutex
	at map[string]*arrivals
}

func (o *byPath) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	a := o.at[r.URL.Path]
	if a == nil {
		a = &arrivals{}
		o.at[r.URL.Path] = a
	}
	o.mu.Unlock()
	a.ServeHTTP(w, r)
}

func (o *byPath) path(p string) *arrivals {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.at[p] == nil {
		o.at[p] = &arrivals{}
	}
	return o.at[p]
}

// TestFairRateByWeight: tenants of weights 3 and 1 share a root rate of
// 40 requests a second (burst 4) under flood, each behind its own
// governor-proxy process, both against a governord process: 16 clients
// on each loop GETs for 12s. Each sidecar paces its requests (one at a
// time asks governord, waiting there for the rate), and governord grants
// the rate's tokens to the two in weighted round robin: from 5s on (after
// any slice of the rate granted while the bucket was quiet has ended) the
// origin sees 30/s of the first and 10/s of the second, each within 25%,
// and the fleet never passes the rate: at most 40/s over the run plus the
// burst.
func TestFairRateByWeight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 12s")
	}
	const (
		rate, burst = 40, 4
		run         = 12 * time.Second
		steady      = 5 * time.Second
		perSidecar  = 16
		heavyKey    = "heavy-key-long-enough-0123456789"
		lightKey    = "light-key-long-enough-0123456789"
	)
	dir := t.TempDir()
	addr := freePort(t)
	cfg := fmt.Sprintf(`listen: %s
metrics_listen: ""
session_ttl: 5s
admin_key: %s
store: {driver: sqlite, dsn: %s}
root:
  rates: {requests: {rate: %d/s, burst: %d}}
tenants:
  - {name: heavy, api_key: %s, weight: 3}
  - {name: light, api_key: %s, weight: 1}
`, addr, adminKey, filepath.Join(dir, "governor.db"), rate, burst, heavyKey, lightKey)
	cfgPath := filepath.Join(dir, "governor.yaml")
	must(t, os.WriteFile(cfgPath, []byte(cfg), 0o600))
	startChild(t, "governord", exec.Command(buildGovernord(t), "-config", cfgPath))

	o := &byPath{at: map[string]*arrivals{}}
	target := originURL(t, o)
	yaml := `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], wait_timeout: 30s, shutdown_timeout: 2s}
rules:
  - {name: api, charge: {requests: 1}}
`
	tenants := []struct {
		name, key, path string
		share           float64
	}{{"heavy", heavyKey, "/heavy", 0.75}, {"light", lightKey, "/light", 0.25}}
	sidecars := make([]*sidecarProc, len(tenants))
	for i, tn := range tenants {
		sidecars[i] = startSidecarProcAt(t, addr, tn.key, "pod-"+tn.name, yaml)
	}
	var failed atomic.Int64
	began := time.Now()
	stop := began.Add(run)
	var wg sync.WaitGroup
	for i, s := range sidecars {
		for range perSidecar {
			tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: s.http}), MaxIdleConnsPerHost: 1}
			t.Cleanup(tr.CloseIdleConnections)
			c := &http.Client{Transport: tr, Timeout: 40 * time.Second}
			wg.Go(func() {
				for time.Now().Before(stop) {
					resp, err := c.Get(target + tenants[i].path)
					if err != nil {
						failed.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	window := (run - steady).Seconds()
	total := 0
	for i, tn := range tenants {
		all := o.path(tn.path).within(began, stop)
		total += len(all)
		got := float64(len(o.path(tn.path).within(began.Add(steady), stop))) / window
		want := tn.share * rate
		t.Logf("%s (weight share %.2f): %.1f/s from %v on (%d in all); want %.0f/s; %v paced at its sidecar",
			tn.name, tn.share, got, steady, len(all), want,
			sidecars[i].metric(t, `governor_proxy_paced_total{resource="requests",status="admitted"}`))
		if got < 0.75*want || got > 1.25*want {
			t.Errorf("%s got %.1f requests a second; want %.0f ± 25%% (its weight's share of %d/s)", tn.name, got, want, rate)
		}
	}
	if most := rate*int(run/time.Second) + burst; total > most {
		t.Errorf("the origin saw %d requests in %v, past %d/s plus the burst (%d)", total, run, rate, most)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d requests failed or were refused; every wait fits in wait_timeout", n)
	}
}
