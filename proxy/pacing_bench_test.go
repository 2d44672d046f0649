package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestSidecarPacingCPU measures, side by side in one run, what a rate that
// does not bind costs the sidecar: the same keep-alive GETs through a
// governor-proxy process whose rule charges calls: 1, once with no rate on
// calls and once under a rate of 10^9 calls a second. It reports the
// sidecar's CPU per request (its process CPU time over the requests) and,
// apart, this process's (governord in process and the clients), rounds
// alternating so that both see the same machine. Run it on purpose:
//
//	GOVERNOR_BENCH_PACING=1 go test ./proxy -run TestSidecarPacingCPU -v
func TestSidecarPacingCPU(t *testing.T) {
	if os.Getenv("GOVERNOR_BENCH_PACING") == "" {
		t.Skip("a measurement: set GOVERNOR_BENCH_PACING=1")
	}
	const (
		clients  = 32
		requests = 20000
		rounds   = 3
	)
	o := originURL(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })) + "/"
	yaml := "rules:\n  - {name: bench, charge: {calls: 1}}\n"
	type setup struct {
		name string
		s    *sidecarProc
	}
	var cases []setup
	for _, rated := range []bool{false, true} {
		g := startGovernord(t, func(c *serverconfig.Config) {
			if rated {
				c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 1_000_000_000, Per: int64(time.Second)}}
			}
		})
		name := map[bool]string{false: "no rate", true: "rate 1e9/s"}[rated]
		cases = append(cases, setup{name, startSidecarProcAt(t, g.Addr(), tenantKey, "bench", yaml)})
	}
	sums := map[string][3]float64{} // sidecar CPU, this process's CPU, wall; all in seconds
	for round := range rounds {
		for _, c := range cases {
			pid := c.s.proc.cmd.Process.Pid
			cpu0, self0, wall0 := procCPU(t, pid), selfCPU(), time.Now()
			loadGets(t, c.s.http, o, clients, requests)
			cpu, self, wall := procCPU(t, pid)-cpu0, selfCPU()-self0, time.Since(wall0)
			t.Logf("round %d, %-10s: %d requests in %v (%.0f/s); sidecar CPU %.1f µs/request, governord and clients %.1f µs/request",
				round, c.name, requests, wall.Round(time.Millisecond), requests/wall.Seconds(),
				cpu.Seconds()/requests*1e6, self.Seconds()/requests*1e6)
			s := sums[c.name]
			sums[c.name] = [3]float64{s[0] + cpu.Seconds(), s[1] + self.Seconds(), s[2] + wall.Seconds()}
		}
	}
	n := float64(requests * rounds)
	base, rated := sums["no rate"], sums["rate 1e9/s"]
	t.Logf("over %d rounds of %d: sidecar CPU %.1f vs %.1f µs/request (%+.0f%%); governord and clients %.1f vs %.1f µs/request (%+.0f%%); %.0f vs %.0f requests/s",
		rounds, requests, base[0]/n*1e6, rated[0]/n*1e6, (rated[0]/base[0]-1)*100,
		base[1]/n*1e6, rated[1]/n*1e6, (rated[1]/base[1]-1)*100, n/base[2], n/rated[2])
}

// loadGets sends n GETs of target through the proxy at addr from conc
// keep-alive clients, and fails on any answer but 200.
func loadGets(t *testing.T, addr, target string, conc, n int) {
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr}), MaxIdleConnsPerHost: conc}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: waitFor}
	var wg sync.WaitGroup
	var mu sync.Mutex
	left := n
	var failed error
	for range conc {
		wg.Go(func() {
			for {
				mu.Lock()
				if left == 0 || failed != nil {
					mu.Unlock()
					return
				}
				left--
				mu.Unlock()
				resp, err := c.Get(target)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
}

// procCPU is the user and system CPU time process pid has used.
func procCPU(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

// selfCPU is the user and system CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
