package main

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/governor-project/governor/sidecar"
)

// startSidecar starts a governor-proxy in this process from the config
// text (written to a file in a folder of the test's own, whose path it
// returns with it), and waits for its session with governord.
func startSidecar(t *testing.T, config string) (*sidecar.Sidecar, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := sidecar.LoadConfig(path)
	if err != nil {
		t.Fatalf("sidecar config: %v\n%s", err, config)
	}
	s, err := sidecar.Start(context.Background(), cfg, sidecar.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the sidecar opened no session with governord within 10s")
	}
	return s, path
}

// viaSidecar is a client that calls the sidecar as a worker given a base
// URL does: at its own address, the path under a route.
func viaSidecar(s *sidecar.Sidecar) (*http.Client, *url.URL) {
	return &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}, &url.URL{Scheme: "http", Host: s.Addr()}
}
