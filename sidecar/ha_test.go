package sidecar

import (
	"io"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/server"
)

// TestSidecarServesAcrossAFailover: a sidecar given both governords'
// addresses keeps admitting requests while the leader stops and a standby
// takes over (from its delegated budgets meanwhile, then at the new
// leader), with the same session.
func TestSidecarServesAcrossAFailover(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_sidecar_ha_")
	ha := func(c *server.Config) {
		c.Store = server.StoreConfig{Driver: "postgres", DSN: dsn}
		c.HA = server.HAConfig{Enabled: true, Lease: time.Second, DriftAllowance: 100 * time.Millisecond}
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
