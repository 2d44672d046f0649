package hacluster

import (
	"testing"
	"time"

	"github.com/governor-project/governor/server/serverconfig"
)

// A member's configuration is one governord takes, with standbys on, its
// addresses, the shared store and the lease and drift asked for (or
// governord's defaults), and the rest of it as given.
func TestMemberConfigIsGovernords(t *testing.T) {
	for _, s := range []Spec{
		{DSN: "postgres://u@127.0.0.1:5432/db?sslmode=disable", Lease: time.Second, Drift: 100 * time.Millisecond,
			More: "session_ttl: 20s\ntenants:\n  - {name: payments, api_key: k}\n"},
		{DSN: "postgres://u@127.0.0.1:5432/db", More: "tenants:\n  - {name: bench, api_key: k}\n"},
	} {
		cfg, err := serverconfig.ParseConfig([]byte(config(s, "127.0.0.1:7001", "127.0.0.1:7002")))
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		wantLease, wantDrift := s.Lease, s.Drift
		if wantLease == 0 {
			wantLease, wantDrift = serverconfig.DefaultHALease, serverconfig.DefaultHADriftAllowance
		}
		if !cfg.HA.Enabled || cfg.HA.AdvertiseAddr != "127.0.0.1:7001" || cfg.Listen != "127.0.0.1:7001" ||
			cfg.MetricsListen != "127.0.0.1:7002" || cfg.Store.Driver != "postgres" || cfg.Store.DSN != s.DSN ||
			cfg.HA.Lease != wantLease || cfg.HA.DriftAllowance != wantDrift || len(cfg.Tenants) != 1 {
			t.Errorf("%+v: %+v", s, cfg)
		}
	}
}

// Leader gives up when no member leads, saying so.
func TestLeaderWithNoMembers(t *testing.T) {
	if _, err := Leader(nil, 10*time.Millisecond); err == nil {
		t.Fatal("a leader among no members")
	}
}
