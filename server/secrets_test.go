package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/apikey"
	"github.com/governor-project/governor/server/serverconfig"
)

// secret has what broke the old ${VAR} expansion, which replaced
// references in the text before YAML read it: "#" began a comment (the key
// was cut short), ": " and "{" made structure, and a newline a new key.
const secret = "Adm1n#k3y: {x}\n  evil: 1 'q\" ${HOME} - [w]"

// leaks reports which recognisable part of secret s shows in text.
func leaks(text, s string) string {
	for _, part := range []string{s, s[:7], url.QueryEscape(s)[:12], "k3y", "evil", "Adm1n"} {
		if strings.Contains(text, part) {
			return part
		}
	}
	return ""
}

func TestSecretsArriveIntact(t *testing.T) {
	t.Setenv("GOV_SECRET", secret)
	t.Setenv("GOV_PAY_KEY", "pay#key:{1}\n2")
	t.Setenv("GOV_DSN", "postgres://gov:"+url.QueryEscape(secret)+"@db:5432/gov")
	cfg, err := serverconfig.ParseConfig([]byte(`
admin_key: ${GOV_SECRET}
store: {driver: postgres, dsn: ${GOV_DSN}}
tenants:
  - {name: payments, api_key: ${GOV_PAY_KEY}, weight: 2}
  - name: quoted
    api_key: "${GOV_SECRET}-2"
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminKey != secret || cfg.Tenants[0].APIKey != "pay#key:{1}\n2" || cfg.Tenants[1].APIKey != secret+"-2" ||
		cfg.Store.DSN != "postgres://gov:"+url.QueryEscape(secret)+"@db:5432/gov" || cfg.Tenants[0].Weight != 2 || len(cfg.Tenants) != 2 {
		t.Fatalf("the values changed on the way: %+v", cfg)
	}
}

// TestConfigErrorsNeverShowSecrets puts a secret where it does not fit:
// every error names the key and the variable, and shows no part of it.
func TestConfigErrorsNeverShowSecrets(t *testing.T) {
	t.Setenv("GOV_SECRET", secret)
	for _, tc := range []struct{ yaml, key string }{
		{"session_ttl: ${GOV_SECRET}\n", "session_ttl"},
		{"listen: ${GOV_SECRET}\n", "listen"},
		{"reap_interval: \"${GOV_SECRET}\"\n", "reap_interval"},
		{"store: {driver: ${GOV_SECRET}}\n", "store.driver"},
		{"tenants:\n  - {name: a, weight: ${GOV_SECRET}}\n", "tenants[0].weight"},
		{"tenants:\n  - {name: a, api_key_sha256: ${GOV_SECRET}}\n", "tenants[0].api_key_sha256"},
		{"adaptive:\n  - {class: ${GOV_SECRET}, target_p95: 1s, min_limit: 1, max_limit: 2}\n  - {class: ${GOV_SECRET}, target_p95: 1s, min_limit: 1, max_limit: 2}\n", "adaptive[1].class"},
		{"root: {limits: {db: ${GOV_SECRET}}}\n", "root.limits"},
	} {
		_, err := serverconfig.ParseConfig([]byte(tc.yaml))
		var ce *serverconfig.ConfigError
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Key, tc.key) {
			t.Errorf("%q: got %v, want an error for %s", tc.yaml, err, tc.key)
			continue
		}
		if part := leaks(err.Error(), secret); part != "" {
			t.Errorf("%q: the error shows %q of the secret: %v", tc.yaml, part, err)
		}
		if !strings.Contains(err.Error(), "${GOV_SECRET}") && ce.Key != "tenants[0].api_key_sha256" {
			t.Errorf("%q: the error does not name the variable: %v", tc.yaml, err)
		}
	}
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestKeysBySHA256 runs governord with keys given only as their SHA-256:
// the keys open sessions, and the file and the logs hold no secret.
func TestKeysBySHA256(t *testing.T) {
	const payKey, adminKey = "pay-key-0123456789abcdef", "k3y"
	text := "listen: 127.0.0.1:0\nmetrics_listen: \"\"\nstore: {driver: memory}\n" +
		"admin_key_sha256: " + apikey.Hash(adminKey) + "\n" +
		"tenants:\n  - {name: payments, api_key_sha256: " + strings.ToUpper(apikey.Hash(payKey)) + "}\n" +
		"  - {name: recon, api_key: ${GOV_SECRET}}\n"
	t.Setenv("GOV_SECRET", secret)
	cfg, err := serverconfig.ParseConfig([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	srv, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, _ := dial(t, srv.Addr())
	scopes := map[int64]string{}
	for _, k := range []struct{ key, name string }{{payKey, "payments"}, {adminKey, "root"}, {secret, "recon"}} {
		resp, err := c.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: k.key})
		if err != nil {
			t.Errorf("the %s key: %v", k.name, err)
			continue
		}
		id := resp.GetScopeNodeId()
		if (id == 1) != (k.name == "root") || scopes[id] != "" {
			t.Errorf("the %s key opened a session on node %d (seen: %v)", k.name, id, scopes)
		}
		scopes[id] = k.name
	}
	for _, wrong := range []string{apikey.Hash(payKey), strings.ToUpper(payKey), ""} {
		_, err := c.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: wrong})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("key %q: %v, want UNAUTHENTICATED", wrong, err)
		}
	}
	srv.Close()
	out := logs.String()
	// Only keys in the clear are measured: a hash hides the key's length.
	if strings.Contains(out, "shorter than") {
		t.Errorf("a key was warned about:\n%s", out)
	}
	if part := leaks(out, secret); part != "" {
		t.Errorf("the log shows %q of a key:\n%s", part, out)
	}
}

func TestShortKeysWarned(t *testing.T) {
	cfg := testConfig() // "admin-key", "pay-key" and "recon-key": all short
	cfg.Tenants[1].APIKey = "recon-key-0123456789"
	logs := &logBuffer{}
	srv, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	out := logs.String()
	for key, want := range map[string]bool{"admin_key": true, "tenants[0].api_key": true, "tenants[1].api_key": false} {
		line := "shorter than 16 bytes can be guessed; use 16 random bytes or more (openssl rand -hex 16)\" key=" + key + "\n"
		if strings.Contains(out, line) != want {
			t.Errorf("warning for %s: %v, want %v\n%s", key, !want, want, out)
		}
	}
	if strings.Contains(out, "pay-key") || strings.Contains(out, "admin-key") {
		t.Errorf("a warning shows the key itself:\n%s", out)
	}
}

func TestKeyHashConfigErrors(t *testing.T) {
	h := apikey.Hash("some-key-0123456789")
	for _, tc := range []struct{ yaml, key string }{
		{"tenants:\n  - {name: a, api_key: k, api_key_sha256: " + h + "}\n", "tenants[0].api_key_sha256"},
		{"admin_key: k\nadmin_key_sha256: " + h + "\n", "admin_key_sha256"},
		{"tenants:\n  - {name: a, api_key_sha256: " + h[:60] + "}\n", "tenants[0].api_key_sha256"},
		{"tenants:\n  - {name: a, api_key_sha256: " + strings.Repeat("g", 64) + "}\n", "tenants[0].api_key_sha256"},
		{"tenants:\n  - {name: a, api_key: some-key-0123456789}\n  - {name: b, api_key_sha256: " + h + "}\n", "tenants[1].api_key"},
		{"admin_key_sha256: " + h + "\ntenants:\n  - {name: a, api_key: some-key-0123456789}\n", "tenants[0].api_key"},
	} {
		_, err := serverconfig.ParseConfig([]byte(tc.yaml))
		var ce *serverconfig.ConfigError
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("%q: got %v, want an error for %s", tc.yaml, err, tc.key)
		}
	}
}
