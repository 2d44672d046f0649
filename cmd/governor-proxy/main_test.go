package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const good = `governor: {addr: "127.0.0.1:1", api_key: k}
task: {name: pod-7}
http: {listen: "127.0.0.1:0"}
metrics_listen: "127.0.0.1:0"
`

func TestExitStatus(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		args []string
		code int
		say  string
	}{
		{"no flags", nil, 2, "usage"},
		{"unknown flag", []string{"-nope"}, 2, "-nope"},
		{"stray argument", []string{"-config", "x", "y"}, 2, "usage"},
		{"bad log level", []string{"-config", "x", "-log-level", "loud"}, 2, "-log-level"},
		{"missing file", []string{"-config", filepath.Join(t.TempDir(), "none.yaml")}, 2, "-config"},
		{"unknown key", []string{"-config", writeConfig(t, good+"htp: {}\n")}, 2, "htp"},
		{"bad rule", []string{"-config", writeConfig(t, good+"rules:\n  - {name: a, match: {port: 0}}\n")}, 2, "rules[0].match.port"},
		{"pgwire tls file missing", []string{"-config", writeConfig(t, good+"pgwire:\n  - {listen: \"127.0.0.1:0\", upstream: \"127.0.0.1:5432\", tls: {cert_file: /nonexistent.pem, key_file: /nonexistent.key}}\n")}, 2, "pgwire[0].tls"},
		{"pgwire bad task_from", []string{"-config", writeConfig(t, good+"pgwire:\n  - {listen: \"127.0.0.1:0\", upstream: \"127.0.0.1:5432\", task_from: user}\n")}, 2, "pgwire[0].task_from"},
		{"pgwire address in use", []string{"-config", writeConfig(t, good+"pgwire:\n  - {listen: \""+busy.Addr().String()+"\", upstream: \"127.0.0.1:5432\"}\n")}, 1, "pgwire[0].listen"},
		{"address in use", []string{"-config", writeConfig(t, strings.Replace(good, "127.0.0.1:0", busy.Addr().String(), 1))}, 1, "http.listen"},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.say) {
			t.Errorf("%s: exit %d, stderr %q; want %d mentioning %q", tc.name, code, stderr.String(), tc.code, tc.say)
		}
	}
}

// A good config starts even while governord is down (failing closed), and
// stops cleanly when told to.
func TestStartsAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stderr bytes.Buffer
	if code := run(ctx, []string{"-config", writeConfig(t, good)}, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "governor-proxy listening") || !strings.Contains(stderr.String(), "governor-proxy stopped") {
		t.Errorf("log: %s", stderr.String())
	}
}
