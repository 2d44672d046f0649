package server

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/server/serverconfig"
)

func TestTLS13Only(t *testing.T) {
	cert := testcert.New(t, "127.0.0.1", "localhost")
	pool := cert.Pool
	cfg := testConfig()
	cfg.TLS = serverconfig.TLSConfig{CertFile: cert.CertFile, KeyFile: cert.KeyFile}
	srv := start(t, cfg)

	open := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = governorpb.NewGovernorClient(conn).OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "pay-key"})
		return err
	}
	if err := open(credentials.NewTLS(&tls.Config{RootCAs: pool})); err != nil {
		t.Fatalf("a TLS client trusting the server's CA: %v", err)
	}
	if err := open(credentials.NewTLS(&tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12})); err == nil {
		t.Fatal("a TLS 1.2 client was served")
	}
	if err := open(insecure.NewCredentials()); err == nil {
		t.Fatal("a plaintext client was served by a TLS server")
	}
	if err := open(credentials.NewTLS(&tls.Config{})); err == nil {
		t.Fatal("a client that does not trust the certificate was served")
	}
}

func TestConfigRefusesPlaintextOffLoopback(t *testing.T) {
	for _, tc := range []struct {
		yaml, key string
	}{
		{"listen: 0.0.0.0:7600\n", "allow_plaintext"},
		{"listen: 10.1.2.3:7600\n", "allow_plaintext"},
		{"listen: 127.0.0.1:7600\ntls: {cert_file: a.pem}\n", "tls"},
		{"tenants:\n  - {name: a, api_key: k}\n  - {name: b, api_key: k}\n", "tenants[1].api_key"},
		{"tenants:\n  - {name: a}\n  - {name: a}\n", "tenants[1].name"},
		{"store: {driver: mysql}\n", "store.driver"},
		{"store: {driver: postgres}\n", "store.dsn"},
		{"adaptive:\n  - {class: psp, target_p95: 300ms, min_limit: 5, max_limit: 2}\n", "adaptive[0]"},
		{"root: {quotas: {tokens: -5}}\n", "root.quotas.tokens"},
		{"session_ttl: 1ms\n", "session_ttl"},
		{"tenants:\n  - {name: a, defaults: {quotas: {retry: x}}}\n", "tenants[0].defaults.quotas"},
		{"nope: 1\n", "nope"},
	} {
		_, err := serverconfig.ParseConfig([]byte(tc.yaml))
		ce, ok := err.(*serverconfig.ConfigError)
		if !ok || len(ce.Key) < len(tc.key) || ce.Key[:len(tc.key)] != tc.key {
			t.Errorf("%q: got %v, want an error naming %s", tc.yaml, err, tc.key)
		}
	}
	cfg, err := serverconfig.ParseConfig([]byte("listen: 0.0.0.0:7600\nallow_plaintext: true\n"))
	if err != nil || cfg.Listen != "0.0.0.0:7600" {
		t.Fatalf("allow_plaintext: %v", err)
	}
	t.Setenv("GOV_TEST_KEY", "s3cr$t")
	cfg, err = serverconfig.ParseConfig([]byte("admin_key: ${GOV_TEST_KEY}\ntenants:\n  - {name: a, api_key: \"$NOT_EXPANDED\"}\n"))
	if err != nil || cfg.AdminKey != "s3cr$t" || cfg.Tenants[0].APIKey != "$NOT_EXPANDED" {
		t.Fatalf("env expansion: %+v %v", cfg, err)
	}
}

func TestExampleConfigLoads(t *testing.T) {
	cfg, err := serverconfig.LoadConfig("../governor.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Driver != "sqlite" || cfg.Listen != serverconfig.DefaultListen || len(cfg.Tenants) != 2 || len(cfg.Adaptive) != 1 {
		t.Fatalf("example config: %+v", cfg)
	}
}
