package proxyconfig

import (
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

const minimal = "governor: {api_key: k}\ntask: {name: pod-7}\n"

func TestConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	h := cfg.HTTP
	if h.Listen != "127.0.0.1:7700" || cfg.MetricsListen != "127.0.0.1:7701" || h.WaitTimeout != 30*time.Second ||
		h.Unmatched != "forward" || h.TunnelIdleTimeout != 5*time.Minute || h.ShutdownTimeout != 30*time.Second ||
		h.AllowLinkLocal || h.ReadHeaderTimeout != 10*time.Second || h.MaxHeaderBytes != 64<<10 {
		t.Errorf("defaults: %+v metrics %q", h, cfg.MetricsListen)
	}
}

func TestConfigEnvAndDeadline(t *testing.T) {
	t.Setenv("POD_NAME", "pod-9")
	t.Setenv("GOVERNOR_API_KEY", "from-env")
	before := time.Now()
	cfg, err := ParseConfig([]byte("task: {name: ${POD_NAME}, deadline: 2h, quotas: {a: 3}}\nmetrics_listen: \"\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Task.Name != "pod-9" || cfg.Task.Quotas["a"] != 3 || cfg.MetricsListen != "" {
		t.Errorf("%+v", cfg)
	}
	if d := cfg.Task.Deadline.Sub(before); d < 2*time.Hour || d > 2*time.Hour+time.Minute {
		t.Errorf("a deadline of 2h is %v away", d)
	}
	if cfg.Task.SubtaskIdle != 0 {
		t.Errorf("subtask_idle left out is %v; want 0, budget's default", cfg.Task.SubtaskIdle)
	}
	cfg, err = ParseConfig([]byte("task: {name: x, subtask_idle: 90s}\n"))
	if err != nil || cfg.Task.SubtaskIdle != 90*time.Second {
		t.Errorf("subtask_idle: 90s is %v, %v", cfg.Task.SubtaskIdle, err)
	}
	cfg, err = ParseConfig([]byte("task: {name: x, deadline: \"2030-01-02T15:04:05Z\"}\n"))
	if err != nil || !cfg.Task.Deadline.Equal(time.Date(2030, 1, 2, 15, 4, 5, 0, time.UTC)) {
		t.Errorf("an RFC 3339 deadline: %v %v", cfg.Task.Deadline, err)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Setenv("GOVERNOR_API_KEY", "")
	for _, tc := range []struct{ text, key string }{
		{"task: {name: x}\n", "governor.api_key"},
		{"governor: {api_key: k}\n", "task.name"},
		{"governor: {api_key: k}\ntask: {name: ''}\n", "task.name"},
		{"governor: {api_key: k}\ntask: {name: ${UNSET_POD_NAME}}\n", "task.name"},
		{"governor: {api_key: k}\ntask: {name: x, subtask_idle: 10ms}\n", "task.subtask_idle"},
		{"governor: {api_key: k}\ntask: {name: x, subtask_idle: later}\n", "task.subtask_idle"},
		{"governor: {api_key: ${UNSET_KEY}}\ntask: {name: x}\n", "governor.api_key"},
		{minimal + "http: {listen: nope}\n", "http.listen"},
		{minimal + "http: {wait_timeout: 0s}\n", "http.wait_timeout"},
		{minimal + "http: {wait_timeout: 30}\n", "http.wait_timeout"},
		{minimal + "http: {wait_timeout: soon}\n", "http.wait_timeout"},
		{minimal + "http: {unmatched: drop}\n", "http.unmatched"},
		{minimal + "http: {max_header_bytes: 10}\n", "http.max_header_bytes"},
		{minimal + "http: {allow_link_local: maybe}\n", "http.allow_link_local"},
		{minimal + "http: {listen_on: x}\n", "http.listen_on"},
		{minimal + "htp: {}\n", "htp"},
		{minimal + "metrics_listen: 7701\n", "metrics_listen"},
		{"governor: {api_key: k}\ntask: {name: x, quotas: {a: -1}}\n", "task.quotas.a"},
		{"governor: {api_key: k}\ntask: {name: x, deadline: tomorrow}\n", "task.deadline"},
		{"governor: {api_key: k}\ntask: {name: x, colour: red}\n", "task.colour"},
		{minimal + "pgwire:\n  - {listen: 127.0.0.1:6432}\n", "pgwire[0].upstream"},
		{minimal + "pgwire:\n  - {listen: 6432, upstream: 127.0.0.1:5432}\n", "pgwire[0].listen"},
		{minimal + "pgwire:\n  - {listen: 127.0.0.1:6432, upstream: x:1, sslmode: on}\n", "pgwire[0].sslmode"},
		{minimal + "routes:\n  - {prefix: openai, upstream: https://api.openai.com}\n", "routes[0].prefix"},
		{minimal + "routes:\n  - {prefix: /a/, upstream: ftp://x}\n", "routes[0].upstream"},
		{minimal + "routes:\n  - {prefix: /a/, upstream: https://x}\n  - {prefix: /a, upstream: https://y}\n", "routes[1].prefix"},
		{minimal + "rules:\n  - {name: a, match: {method: FETCH}}\n", "rules[0].match.method"},
		{minimal + "rules:\n  - {name: a}\n  - {name: a}\n", "rules[1].name"},
		{minimal + "rules:\n  - {name: a, on_rate: queue}\n", "rules[0].on_rate"},
		{minimal + "rules:\n  - {name: a, on_rate: ''}\n", "rules[0].on_rate"},
		{minimal + "rules:\n  - {name: a, on_rate: 0}\n", "rules[0].on_rate"},
		{minimal + "rules:\n  - {name: a, on_rate: -1}\n", "rules[0].on_rate"},
		{minimal + "rules:\n  - {name: a, on_rate: 99999999999999999999999}\n", "rules[0].on_rate"},
		{minimal + "rules:\n  - {name: a, on_rate: [deny]}\n", "rules[0].on_rate"},
		{minimal + "rules:\n  - {name: a, on_rate: {deny: true}}\n", "rules[0].on_rate"},
		{minimal + "http: [1]\n", "http"},
		{"a: [unclosed", "(file)"},
		{"", "(file)"},
	} {
		_, err := ParseConfig([]byte(tc.text))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("%q: got %v, want a ConfigError for key %s", tc.text, err, tc.key)
		}
	}
	t.Setenv("GOVERNOR_TLS", "yes")
	if _, err := ParseConfig([]byte(minimal)); err == nil || !strings.Contains(err.Error(), "GOVERNOR_TLS") {
		t.Errorf("a bad GOVERNOR_TLS: %v", err)
	}
}

// TestExampleDocumentsEveryKey loads proxy.example.yaml and checks that it
// names every key the file may hold.
func TestExampleDocumentsEveryKey(t *testing.T) {
	t.Setenv("GOVERNOR_API_KEY", "k")
	t.Setenv("POD_NAME", "pod-7")
	cfg, err := LoadConfig("../../proxy.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules.Len() == 0 || len(cfg.Routes) == 0 || len(cfg.PGWire) == 0 {
		t.Errorf("the example should show rules, routes and pgwire: %+v", cfg)
	}
	text, _ := os.ReadFile("../../proxy.example.yaml")
	var keys []string
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			keys = append(keys, strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0])
			walk(t.Field(i).Type)
		}
	}
	walk(reflect.TypeFor[fileConfig]())
	keys = append(keys, "name", "match", "class", "charge", "charge_from_header", "resource", "header",
		"host", "port", "scheme", "method", "path", "sql", "tables", "database", "user", "application_name")
	for _, k := range keys {
		if k == "" {
			continue
		}
		if !regexp.MustCompile(`(?m)^[ -]*` + regexp.QuoteMeta(k) + `:|[{,] *` + regexp.QuoteMeta(k) + `:`).Match(text) {
			t.Errorf("proxy.example.yaml does not show the key %q", k)
		}
	}
}
