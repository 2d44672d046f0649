package proxy

import (
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"
)

// secretKey has what broke the old ${VAR} expansion, which replaced
// references in the text before YAML read it: "#" began a comment (the key
// was cut short), ": " and "{" made structure, and a newline a new key.
const secretKey = "Pr0xy#k3y: {x}\n  evil: 1 'q\" ${HOME} - [w]"

// leaked reports which recognisable part of the secret shows in text.
func leaked(text string) string {
	for _, part := range []string{secretKey, secretKey[:7], "k3y", "evil", "Pr0xy"} {
		if strings.Contains(text, part) {
			return part
		}
	}
	return ""
}

// TestSecretKeyEndToEnd gives the sidecar a key with every troublesome
// character through ${VAR}: the key reaches governord intact (the session
// opens and requests are governed), and no log line shows it.
func TestSecretKeyEndToEnd(t *testing.T) {
	t.Setenv("PROXY_SECRET_KEY", secretKey)
	g := startGovernord(t, func(c *serverconfig.Config) { c.Tenants[0].APIKey = secretKey })
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), key: "${PROXY_SECRET_KEY}", path: filepath.Join(t.TempDir(), "proxy.yaml"), yaml: `
task: {name: pod-7, quotas: {calls: 1}}
rules:
  - {name: any, class: api, charge: {calls: 1}}
`})
	c := p.client("crawl-42", nil)
	for i, want := range []int{200, 429} {
		resp, err := c.Get(hostURL(o, "origin.test") + "/")
		if err != nil {
			t.Fatal(err)
		}
		if readAll(t, resp); resp.StatusCode != want {
			t.Errorf("request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	p.Close()
	if part := leaked(p.logs.String()); part != "" {
		t.Errorf("the log shows %q of the key:\n%s", part, p.logs.String())
	}
	if strings.Contains(p.logs.String(), "shorter than") {
		t.Errorf("a long key was warned about:\n%s", p.logs.String())
	}
}

// TestConfigErrorsNeverShowSecrets puts the secret where it does not fit:
// each error names the key and the variable, and shows no part of it.
func TestConfigErrorsNeverShowSecrets(t *testing.T) {
	t.Setenv("PROXY_SECRET_KEY", secretKey)
	for _, tc := range []struct{ yaml, key string }{
		{"http: {wait_timeout: ${PROXY_SECRET_KEY}}\n", "http.wait_timeout"},
		{"http: {listen: ${PROXY_SECRET_KEY}}\n", "http.listen"},
		{"http: {allow_link_local: \"${PROXY_SECRET_KEY}\"}\n", "http.allow_link_local"},
		{"task: {name: pod-7, deadline: ${PROXY_SECRET_KEY}}\n", "task.deadline"},
		{"routes:\n  - {prefix: /a/, upstream: ${PROXY_SECRET_KEY}}\n", "routes[0].upstream"},
		{"pgwire:\n  - {listen: 127.0.0.1:0, upstream: ${PROXY_SECRET_KEY}}\n", "pgwire[0].upstream"},
		{"rules:\n  - {name: a, match: {method: ${PROXY_SECRET_KEY}}}\n", "rules[0].match.method"},
		{"rules:\n  - {name: a, match: {port: ${PROXY_SECRET_KEY}}}\n", "rules[0].match.port"},
	} {
		text := "governor: {api_key: ${PROXY_SECRET_KEY}}\n" + tc.yaml
		if !strings.Contains(tc.yaml, "task:") {
			text += "task: {name: pod-7}\n"
		}
		_, err := proxyconfig.ParseConfig([]byte(text))
		var ce *proxyconfig.ConfigError
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("%q: got %v, want an error for %s", tc.yaml, err, tc.key)
			continue
		}
		if part := leaked(err.Error()); part != "" {
			t.Errorf("%q: the error shows %q of the secret: %v", tc.yaml, part, err)
		}
		if !strings.Contains(err.Error(), "${PROXY_SECRET_KEY}") {
			t.Errorf("%q: the error does not name the variable: %v", tc.yaml, err)
		}
	}
	cfg, err := proxyconfig.ParseConfig([]byte("governor: {api_key: ${PROXY_SECRET_KEY}}\ntask: {name: pod-7}\n"))
	if err != nil || cfg.Governor.APIKey != secretKey {
		t.Errorf("the key changed on the way: %q %v", cfg.Governor.APIKey, err)
	}
}

func TestShortKeyWarned(t *testing.T) {
	const short = "k3y-12345"
	g := startGovernord(t, func(c *serverconfig.Config) { c.Tenants[0].APIKey = short })
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), key: short})
	p.Close()
	out := p.logs.String()
	if !strings.Contains(out, "shorter than 16 bytes can be guessed") || !strings.Contains(out, "key=governor.api_key") {
		t.Errorf("no warning for a %d-byte key:\n%s", len(short), out)
	}
	if strings.Contains(out, short) {
		t.Errorf("the warning shows the key:\n%s", out)
	}
}
