package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/proxy/intercept"
)

// interceptConfig writes, in a directory of its own named name, a CA made
// with o, its key with mode keyMode, and a sidecar config intercepting
// api.example.com with them; keyFrom, when not nil, is written as the key
// instead. It returns the config's path and the CA's certificate.
func interceptConfig(t *testing.T, name string, o intercept.CAOptions, keyMode os.FileMode, keyFrom []byte) (string, *intercept.CA) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := intercept.NewCA(o)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := intercept.ParseCA(certPEM, keyPEM, o.Now)
	if err != nil {
		t.Fatal(err)
	}
	if keyFrom != nil {
		keyPEM = keyFrom
	}
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, keyMode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(keyFile, keyMode) // whatever the umask
	config := filepath.Join(dir, "proxy.yaml")
	text := fmt.Sprintf("task: {name: worker-1}\nhttp:\n  intercept:\n    hosts: [api.example.com]\n    ca_cert: %s\n    ca_key: %s\nrules:\n  - {name: api, match: {host: api.example.com}, class: llm}\n",
		certFile, keyFile)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return config, ca
}

// findingLines are the lines doctor printed about check for subject, each
// with its fix line, if any, joined to it.
func findingLines(out, check, subject string) []string {
	var lines []string
	text := strings.Split(out, "\n")
	for i, l := range text {
		if len(l) < 18 || strings.TrimSpace(l[6:18]) != check || !strings.HasPrefix(l[19:], subject) {
			continue
		}
		if i+1 < len(text) && strings.Contains(text[i+1], "fix: ") {
			l += "\n" + text[i+1]
		}
		lines = append(lines, l)
	}
	return lines
}

// TestDoctorInterceptCA gives doctor sidecar configs with http.intercept
// and reads what it prints of each CA: a good one is OK and says when it
// expires; one expiring within -ca-warn is a warning saying when; a key
// others can read is a warning; a key that is not the CA's is an error.
// Each says how to fix it.
func TestDoctorInterceptCA(t *testing.T) {
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down.Close() // governord is not under test: nothing listens there
	t.Setenv("GOVERNOR_ADDR", down.Addr().String())
	t.Setenv("GOVERNOR_API_KEY", "any")

	now := time.Now()
	hosts, err := intercept.ParseHosts([]string{"api.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	good, goodCA := interceptConfig(t, "good", intercept.CAOptions{Now: now, Validity: 90 * 24 * time.Hour, Hosts: hosts}, 0o600, nil)
	expiring, expiringCA := interceptConfig(t, "expiring", intercept.CAOptions{Now: now.Add(-87 * 24 * time.Hour), Validity: 90 * 24 * time.Hour}, 0o600, nil)
	readable, _ := interceptConfig(t, "readable", intercept.CAOptions{Now: now}, 0o644, nil)
	_, otherKey, err := intercept.NewCA(intercept.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mismatched, _ := interceptConfig(t, "mismatched", intercept.CAOptions{Now: now}, 0o600, otherKey)
	plain := filepath.Join(t.TempDir(), "plain.yaml")
	os.WriteFile(plain, []byte("task: {name: worker-1}\nrules:\n  - {name: api, match: {host: api.example.com}, class: llm}\n"), 0o644)

	args := []string{"doctor", "-timeout", "300ms"}
	for _, p := range []string{good, expiring, readable, mismatched, plain} {
		args = append(args, "-proxy-config", p)
	}
	code, out, errOut := cli(t, args...)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, want := range []struct {
		config string
		level  string
		parts  []string
	}{
		{good, "OK", []string{`the CA "Governor interception CA"`, "expires " + goodCA.Cert.NotAfter.UTC().Format(time.RFC3339), ", in 2160h0m0s"}},
		{good, "OK", []string{"may sign only for api.example.com (name constraints)"}},
		{expiring, "WARN", []string{"expires " + expiringCA.Cert.NotAfter.UTC().Format(time.RFC3339) + ", in 7", // 71h59m or 72h0m
			"fix: make a new CA before then (governor ca create -out DIR -force"}},
		{readable, "WARN", []string{"ca-key.pem is readable by others (mode 0644)", "fix: chmod 600 "}},
		{mismatched, "ERROR", []string{"cannot sign: the key does not match the CA certificate",
			"fix: point http.intercept.ca_cert and ca_key at a CA and its own key"}},
	} {
		found := false
		for _, l := range findingLines(out, "intercept", want.config+": http.intercept: ") {
			all := strings.HasPrefix(l, want.level+" ")
			for _, p := range want.parts {
				all = all && strings.Contains(l, p)
			}
			found = found || all
		}
		if !found {
			t.Errorf("%s: no %s intercept line with %q:\n%s", want.config, want.level, want.parts, out)
		}
	}
	// What is fine draws no warning, and a config that intercepts nothing no line.
	for _, config := range []string{good, plain} {
		for _, l := range findingLines(out, "intercept", config) {
			if !strings.HasPrefix(l, "OK ") || config == plain {
				t.Errorf("%s: %s", config, l)
			}
		}
	}
	if code, _, _ := cli(t, "doctor", "-ca-warn", "-1h"); code != 2 {
		t.Errorf("a negative -ca-warn: exit %d, want 2", code)
	}
}
