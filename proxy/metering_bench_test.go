package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// benchLLM is a sidecar with two routes to the same fake provider over
// HTTPS: /openai/ under a metered rule, /plain/ under a rule with the same
// class and a plain charge, so that the two differ only by metering.
func benchLLM(b *testing.B, fake *fakellm.Provider) string {
	srv := startGovernord(b, nil)
	up := origin(b, fake, true, false)
	u := hostURL(up, "example.com")
	p := startProxy(b, proxyOpts{gaddr: srv.Addr(), tls: certPool(up), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {tokens: 1000000000000, calls: 1000000000000}}
delegation: {max_reservation: 1000000000}
routes:
  - {prefix: /openai/, upstream: "%s/metered"}
  - {prefix: /plain/, upstream: "%s/plain"}
rules:
  - {name: metered, match: {path: /metered, method: POST}, class: llm, meter: {api: openai, reserve: 1000}}
  - {name: plain, match: {path: /plain, method: POST}, class: llm, charge: {calls: 1}}
`, u, u)})
	return "http://" + p.Addr()
}

const benchChat = `{"model":"gpt-4o-mini","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"Say hello."}]}`

// firstByte posts a streamed chat completion and returns the time to its
// first event, and the response to finish.
func firstByte(b *testing.B, c *http.Client, url string) (time.Duration, *http.Response, *bufio.Reader) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(benchChat))
	req.Header.Set("Content-Type", "application/json")
	began := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			b.Fatalf("%s: %d: %v", url, resp.StatusCode, err)
		}
		if line == "\n" {
			return time.Since(began), resp, r
		}
	}
}

// BenchmarkMeteredFirstByte measures, in one run, the time to the first
// event of a streamed chat completion through a metered route and through
// the same route unmetered, alternating, one client. It reports the p50
// and p99 of each and the p50 metering adds.
//
//	flock /tmp/governor-heavy.lock go test -run '^$' -bench MeteredFirstByte -benchtime 2000x ./proxy
func BenchmarkMeteredFirstByte(b *testing.B) {
	base := benchLLM(b, &fakellm.Provider{})
	c := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4}}
	defer c.CloseIdleConnections()
	var metered, plain []time.Duration
	for i := 0; i < 50; i++ { // warm up connections and reservations
		for _, path := range []string{"/openai/chat/completions", "/plain/chat/completions"} {
			_, resp, r := firstByte(b, c, base+path)
			io.Copy(io.Discard, r)
			resp.Body.Close()
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, m := range []bool{i%2 == 0, i%2 != 0} {
			path, into := "/plain/chat/completions", &plain
			if m {
				path, into = "/openai/chat/completions", &metered
			}
			d, resp, r := firstByte(b, c, base+path)
			*into = append(*into, d)
			io.Copy(io.Discard, r)
			resp.Body.Close()
		}
	}
	b.StopTimer()
	pct := func(ds []time.Duration, p float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[int(p*float64(len(s)-1))].Microseconds())
	}
	b.ReportMetric(pct(metered, 0.5), "metered-p50-µs")
	b.ReportMetric(pct(metered, 0.99), "metered-p99-µs")
	b.ReportMetric(pct(plain, 0.5), "plain-p50-µs")
	b.ReportMetric(pct(plain, 0.99), "plain-p99-µs")
	b.ReportMetric(pct(metered, 0.5)-pct(plain, 0.5), "added-p50-µs")
}

// BenchmarkMeteredStreamMemory holds 200 streams open (the fake waits on
// its gate after the first event) through each route, and reports the heap
// in use per open stream, the whole process's (client, sidecar and fake),
// and the difference metering makes. Run it once (-benchtime 1x): the
// streams stay open until it ends.
//
//	flock /tmp/governor-heavy.lock go test -run '^$' -bench MeteredStreamMemory -benchtime 1x ./proxy
func BenchmarkMeteredStreamMemory(b *testing.B) {
	const streams = 200
	gate := make(chan struct{})
	base := benchLLM(b, &fakellm.Provider{Gate: gate})
	c := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: streams}}
	defer c.CloseIdleConnections()
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	perStream := map[string]float64{}
	var open []*http.Response
	for _, path := range []string{"/plain/chat/completions", "/openai/chat/completions"} {
		before := heap()
		for range streams {
			_, resp, _ := firstByte(b, c, base+path)
			open = append(open, resp)
		}
		perStream[path] = float64(heap()-before) / streams
	}
	close(gate) // every fake stream runs to its end
	for _, resp := range open {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(perStream["/openai/chat/completions"], "metered-B/stream")
	b.ReportMetric(perStream["/plain/chat/completions"], "plain-B/stream")
	b.ReportMetric(perStream["/openai/chat/completions"]-perStream["/plain/chat/completions"], "added-B/stream")
}
