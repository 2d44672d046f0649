package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server/serverconfig"
)

// buildCLI builds this command, as a user runs it: once per test run, into
// a folder TestMain removes.
func buildCLI(t *testing.T) string { return govtest.Binary(t, "cmd/governor") }

func TestMain(m *testing.M) {
	code := m.Run()
	govtest.RemoveBinaries()
	os.Exit(code)
}

// gov runs the built command with args, as an operator does, against the
// governord the environment names.
func gov(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLI(t, buildCLI(t), "", args...)
}

func runCLI(t *testing.T, bin, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errOut.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

// TestHashKey runs the built CLI, then gives what it printed to governord
// as api_key_sha256: the key opens a session.
func TestHashKey(t *testing.T) {
	bin := buildCLI(t)
	const key = "pay#key: {x}\n0123456789"
	sum := sha256.Sum256([]byte(key))
	want := hex.EncodeToString(sum[:]) + "\n"
	for _, in := range []string{key, key + "\n", key + "\r\n"} {
		code, out, errOut := runCLI(t, bin, in, "hash-key")
		if code != 0 || out != want || errOut != "" {
			t.Errorf("stdin %q: exit %d, %q %q; want %q", in, code, out, errOut, want)
		}
	}

	cfg, err := serverconfig.ParseConfig([]byte("listen: 127.0.0.1:0\nmetrics_listen: \"\"\nstore: {driver: memory}\n" +
		"tenants:\n  - {name: payments, api_key_sha256: " + strings.TrimSpace(want) + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := govtest.StartConfig(t, cfg)
	c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(key))
	if err != nil {
		t.Fatalf("the key whose hash the CLI printed: %v", err)
	}
	c.Close()
	if _, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(strings.TrimSpace(want))); err == nil {
		t.Error("the hash itself opened a session")
	}
}

func TestHashKeyRefuses(t *testing.T) {
	bin := buildCLI(t)
	const key = "a-key-on-the-command-line"
	code, out, errOut := runCLI(t, bin, "", "hash-key", key)
	if code != 2 || out != "" || !strings.Contains(errOut, "read from stdin") || strings.Contains(errOut, key) {
		t.Errorf("a key as an argument: exit %d, %q %q", code, out, errOut)
	}
	for _, in := range []string{"", "\n", strings.Repeat("k", 65<<10)} {
		if code, out, _ := runCLI(t, bin, in, "hash-key"); code != 2 || out != "" {
			t.Errorf("stdin of %d bytes: exit %d, %q", len(in), code, out)
		}
	}
	code, out, errOut = runCLI(t, bin, "short-key\n", "hash-key")
	if sum := sha256.Sum256([]byte("short-key")); code != 0 || out != hex.EncodeToString(sum[:])+"\n" ||
		!strings.Contains(errOut, "9 bytes long") || strings.Contains(errOut, "short-key") {
		t.Errorf("a short key: exit %d, %q %q; want its hash and a warning", code, out, errOut)
	}
}
