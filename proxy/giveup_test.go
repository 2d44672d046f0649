package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/pgtest"
)

// Clients of the HTTP sidecar that give up must leave nothing held at
// governord (issue 10, point 6): through a real governor-proxy process, to
// a real governord process on SQLite and on PostgreSQL, with delegated
// budgets on (the default) and off.

// sidecarGiveUps is how many requests TestGivingUpThroughTheSidecar sends
// per case: the 5,000.
const sidecarGiveUps = 5000

// Many clients give up at random instants between 0.2 and 3 ms, against a
// class of root limit 1: afterwards governord holds no slot of the class
// (once the sidecar's idle slots have lingered back) and a patient request
// is admitted without queueing at governord.
func TestGivingUpThroughTheSidecar(t *testing.T) {
	for _, store := range []string{"sqlite", "postgres"} {
		for _, delegate := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/delegation=%v", store, delegate), func(t *testing.T) {
				g := startGovProcOn(t, store, "root: {limits: {api: 1}}\ntenants:\n  - {name: payments, api_key: "+tenantKey+"}\n")
				o := originURL(t, &meter{})
				s := startSidecarProc(t, g, tenantKey, "pod-a", fmt.Sprintf(
					"rules:\n  - {name: api, match: {host: 127.0.0.1}, class: api}\ndelegation: {enabled: %v}\n", delegate))
				giveUpThrough(t, s, o)
				// Requests whose clients left may still be on their way
				// through the sidecar; then idle slots linger back.
				eventually(t, "the sidecar to finish with every request", func() bool {
					return s.metric(t, "governor_proxy_requests_in_flight") == 0
				})
				eventually(t, "governord to hold no slot of api", func() bool {
					return scrape(t, g.metrics, `governor_pool_held{class="api",tenant=""}`) == 0
				})
				if waiting := scrape(t, g.metrics, "governor_acquires_waiting"); waiting != 0 {
					t.Errorf("%v acquires still wait at governord", waiting)
				}
				t.Logf("governord gave back %v grants whose callers had gone and %v abandoned ones",
					scrape(t, g.metrics, `governor_given_back_total{why="caller_gone"}`),
					scrape(t, g.metrics, `governor_given_back_total{why="abandoned"}`))
				queued := scrape(t, g.metrics, "governor_acquire_wait_seconds_count")
				resp, err := s.client(t).Get(o + "/")
				if err != nil {
					t.Fatalf("the patient request: %v", err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("the patient request: %s", resp.Status)
				}
				if now := scrape(t, g.metrics, "governor_acquire_wait_seconds_count"); now != queued {
					t.Errorf("the patient request queued at governord: the slot was held")
				}
			})
		}
	}
}

// startGovProcOn is startGovProc with the store named: "sqlite" (its
// default), or "postgres" in a schema of its own.
func startGovProcOn(t *testing.T, store, yaml string) *govProc {
	t.Helper()
	if store == "sqlite" {
		return startGovProc(t, yaml)
	}
	g := &govProc{t: t, dir: t.TempDir()}
	g.cfgPath = filepath.Join(g.dir, "governor.yaml")
	must(t, os.WriteFile(g.cfgPath, []byte(fmt.Sprintf(
		"listen: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\nadmin_key: %s\nstore: {driver: postgres, dsn: %q}\n",
		adminKey, pgtest.Schema(t, "giveup_"))+yaml), 0o600))
	g.start()
	return g
}

// giveUpThrough sends sidecarGiveUps requests to origin through s, 64 at a
// time, each given up by its client after a random 0.2 to 3 ms.
func giveUpThrough(t *testing.T, s *sidecarProc, origin string) {
	t.Helper()
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: s.http}), MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	var admitted, gaveUp, refused atomic.Int64
	var wg sync.WaitGroup
	inFlight := make(chan struct{}, 64)
	began := time.Now()
	for range sidecarGiveUps {
		inFlight <- struct{}{}
		wg.Go(func() {
			defer func() { <-inFlight }()
			patience := 200*time.Microsecond + rand.N(2800*time.Microsecond)
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, "GET", origin+"/", nil)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				gaveUp.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				admitted.Add(1)
			} else {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d requests in %v: %d admitted, %d given up by their clients, %d refused",
		sidecarGiveUps, time.Since(began).Round(time.Millisecond), admitted.Load(), gaveUp.Load(), refused.Load())
}
