// Package govtest is the tests' one harness: a real governord started in
// process on :0 listeners (Start), the repository's binaries built once to
// run as processes (Binary), a free port for a process that must be told
// one (FreeAddr), a log buffer (LogBuffer) and waiting for a fact
// (Eventually). It may import the server and its configuration only.
package govtest

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// The keys of the configuration Config returns.
const (
	// TenantKey is the API key of the tenant "payments".
	TenantKey = "pay-key-for-tests"
	// AdminKey is the operator's key, scoped to the root.
	AdminKey = "admin-key-for-tests"
	// Tenant is the name of the one tenant.
	Tenant = "payments"
)

// Config is an in-process governord on the memory store with one tenant,
// Tenant, whose key is TenantKey, a short session TTL and a quick reaper.
func Config() serverconfig.Config {
	return serverconfig.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", SessionTTL: 5 * time.Second,
		AdminKey: AdminKey, Store: serverconfig.StoreConfig{Driver: "memory"}, ReapInterval: 20 * time.Millisecond,
		Tenants: []serverconfig.TenantConfig{{Name: Tenant, APIKey: TenantKey, Weight: 1}}}
}

// Start starts governord from Config, changed by edit when not nil, and
// closes it when the test ends. It returns once the server is ready.
func Start(t testing.TB, edit func(*serverconfig.Config)) *server.Server {
	t.Helper()
	cfg := Config()
	if edit != nil {
		edit(&cfg)
	}
	return StartConfig(t, cfg)
}

// StartConfig starts governord from cfg and closes it when the test ends
// (a test may close it sooner, to start another on the same store). It
// returns once the server is ready.
func StartConfig(t testing.TB, cfg serverconfig.Config) *server.Server {
	t.Helper()
	srv, err := server.Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("start governord: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// StartMain is Start for a TestMain, which has no test to fail or clean up
// after: the caller closes the server once m.Run returns.
func StartMain(edit func(*serverconfig.Config)) (*server.Server, error) {
	cfg := Config()
	if edit != nil {
		edit(&cfg)
	}
	srv, err := server.Start(context.Background(), cfg, nil)
	if err != nil {
		return nil, fmt.Errorf("start governord: %w", err)
	}
	return srv, nil
}

// Metric returns the value of one series of srv's /metrics, as its
// exposition line names it (e.g. `governor_leases` or
// `governor_calls_total{code="OK",method="Consume"}`); 0 when absent.
func Metric(t testing.TB, srv *server.Server, series string) float64 {
	t.Helper()
	return Scrape(t, srv.MetricsAddr(), series)
}

// Scrape is Metric for any /metrics endpoint, at addr.
func Scrape(t testing.TB, addr, series string) float64 {
	t.Helper()
	// Never through a proxy from the environment; and a connection per
	// scrape, closed after it: a transport made per call and left with an
	// idle connection keeps it, and the server its buffers, for good, which
	// a test that measures the heap would count.
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return v
		}
	}
	return 0
}
