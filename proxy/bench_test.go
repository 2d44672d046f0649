package proxy

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// BenchmarkProxy measures, in one run, the same keep-alive GETs of a 1 KiB
// response sent directly, through bare goproxy (no governance), and through
// governor-proxy with a lease and a charge on every request (governord in
// memory and on SQLite), with 1 and 32 concurrent clients. Two more cases
// show where the time goes: a rule that asks governord nothing, and one
// that only charges.
//
//	go test -run '^$' -bench Proxy -benchtime 3s ./proxy/
//
// Each reports p50 and p99 latency, requests per second and, for the
// proxies, the p50 and p99 added over the direct run of the same
// concurrency.
func BenchmarkProxy(b *testing.B) {
	body := strings.Repeat("x", 1024)
	o := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
	defer o.Close()

	bare := goproxy.NewProxyHttpServer()
	bare.Logger = log.New(io.Discard, "", 0)
	bare.Tr = &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 256}
	bareSrv := httptest.NewServer(bare)
	defer bareSrv.Close()

	targets := []struct {
		name  string
		proxy func(b *testing.B) (string, func())
	}{
		{"direct", func(*testing.B) (string, func()) { return "", func() {} }},
		{"goproxy", func(*testing.B) (string, func()) { return bareSrv.URL, func() {} }},
		{"governor-memory", func(b *testing.B) (string, func()) { return benchGovernor(b, "memory", leaseAndCharge) }},
		{"governor-sqlite", func(b *testing.B) (string, func()) { return benchGovernor(b, "sqlite", leaseAndCharge) }},
		// What the rest is made of: the proxy with a rule that asks
		// governord nothing, and with one that only charges (one call, no
		// release).
		{"governor-nocall", func(b *testing.B) (string, func()) { return benchGovernor(b, "memory", "") }},
		{"governor-chargeonly", func(b *testing.B) (string, func()) { return benchGovernor(b, "memory", ", charge: {calls: 1}") }},
	}
	direct := map[int][2]time.Duration{}
	for _, tg := range targets {
		for _, conc := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/clients=%d", tg.name, conc), func(b *testing.B) {
				proxyURL, stop := tg.proxy(b)
				defer stop()
				p50, p99, rps := benchGets(b, o.URL+"/", proxyURL, conc)
				b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
				b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
				b.ReportMetric(rps, "req/s")
				if tg.name == "direct" {
					direct[conc] = [2]time.Duration{p50, p99}
				} else if d, ok := direct[conc]; ok {
					b.ReportMetric(float64((p50 - d[0]).Microseconds()), "added-p50-µs")
					b.ReportMetric(float64((p99 - d[1]).Microseconds()), "added-p99-µs")
				}
			})
		}
	}
}

// leaseAndCharge is the benchmark's rule: a lease and a charge on every
// request.
const leaseAndCharge = ", class: bench, charge: {calls: 1}"

// benchGovernor starts governord on the store driver and governor-proxy in
// front of it, with one rule that matches every request and yields what
// rule says (the rest of its flow mapping).
func benchGovernor(b *testing.B, driver, rule string) (string, func()) {
	cfg := govtest.Config()
	cfg.Store.Driver = driver
	if driver == "sqlite" {
		cfg.Store.DSN = filepath.Join(b.TempDir(), "governor.db")
	}
	g := govtest.StartConfig(b, cfg)
	pcfg, err := proxyconfig.ParseConfig([]byte(fmt.Sprintf(`
governor: {addr: %q, api_key: %s}
task: {name: bench, quotas: {calls: 1000000000}, limits: {bench: 1000}}
http: {listen: 127.0.0.1:0, allow_targets: [localhost]}
metrics_listen: ""
rules:
  - {name: bench%s}
`, g.Addr(), tenantKey, rule)))
	if err != nil {
		b.Fatal(err)
	}
	// A decision line per request, formatted as in production, to nowhere.
	p, err := Start(context.Background(), pcfg, Options{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-p.Ready():
	case <-time.After(waitFor):
		b.Fatal("no session")
	}
	return "http://" + p.Addr(), func() {
		p.Close()
		g.Close()
	}
}

// benchGets sends b.N GETs from conc goroutines over keep-alive connections
// and returns the p50 and p99 latency and the throughput.
func benchGets(b *testing.B, target, proxy string, conc int) (p50, p99 time.Duration, rps float64) {
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true}
	if proxy != "" {
		u, _ := url.Parse(proxy)
		tr.Proxy = http.ProxyURL(u)
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func() error {
		resp, err := c.Get(target)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return err
	}
	for range conc { // warm the connections
		if err := get(); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	began := time.Now()
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := get(); err != nil {
					failed.Store(err)
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return all[len(all)/2], all[len(all)*99/100], float64(len(all)) / elapsed.Seconds()
}
