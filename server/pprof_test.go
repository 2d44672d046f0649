package server

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/governor-project/governor/server/serverconfig"
)

// Go's profiles are served on the metrics listener only with
// debug: {pprof: true}; by default /debug/pprof/ is not found.
func TestPProfIsOffUnlessAsked(t *testing.T) {
	get := func(srv *Server, path string) (int, string) {
		t.Helper()
		r, err := http.Get("http://" + srv.MetricsAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		body, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(body)
	}
	off := start(t, testConfig())
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/trace?seconds=1", "/debug/pprof/profile?seconds=1"} {
		if code, _ := get(off, path); code != http.StatusNotFound {
			t.Errorf("GET %s without debug.pprof: %d, want 404", path, code)
		}
	}
	cfg := testConfig()
	cfg.PProf = true
	on := start(t, cfg)
	if code, body := get(on, "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("GET /debug/pprof/ with debug.pprof: %d %.100q, want 200 and the profiles' index", code, body)
	}
	if code, body := get(on, "/debug/pprof/heap?debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("GET /debug/pprof/heap with debug.pprof: %d %.100q, want 200 and a heap profile", code, body)
	}
	if code, _ := get(on, "/metrics"); code != http.StatusOK {
		t.Errorf("GET /metrics with debug.pprof: %d", code)
	}
}

// debug.pprof is a boolean, off by default, and needs the metrics
// listener it is served on.
func TestConfigOfDebugPProf(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte("admin_key: k\n"))
	if err != nil || cfg.PProf {
		t.Fatalf("default: pprof %v, %v; want off", cfg.PProf, err)
	}
	cfg, err = serverconfig.ParseConfig([]byte("admin_key: k\ndebug: {pprof: true}\n"))
	if err != nil || !cfg.PProf {
		t.Fatalf("debug: {pprof: true}: pprof %v, %v; want on", cfg.PProf, err)
	}
	for _, bad := range []string{
		`debug: {pprof: true}` + "\nmetrics_listen: \"\"",
		`debug: {pprof: "maybe"}`, `debug: {pprof: 1}`, `debug: {pprof: 0}`, `debug: {pprof: -1}`,
		`debug: {pprof: 2147483648}`, `debug: {pprof: 9007199254740992}`, `debug: {pprof: 9223372036854775807}`,
		`debug: {pprof: [true]}`, `debug: {pprof: {on: true}}`, `debug: {pprof: 1.5}`, `debug: true`,
		`debug: {profiles: true}`,
	} {
		_, err := serverconfig.ParseConfig([]byte("admin_key: k\n" + bad + "\n"))
		var ce *serverconfig.ConfigError
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Key, "debug") {
			t.Errorf("%s: %v; want a config error naming debug.pprof", bad, err)
		}
	}
}
