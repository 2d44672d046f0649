package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/proxy"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// startSidecar starts a governor-proxy in this process from the config
// text (written to a file in a folder of the test's own, whose path it
// returns with it), and waits for its session with governord.
func startSidecar(t *testing.T, config string) (*proxy.Sidecar, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := proxyconfig.LoadConfig(path)
	if err != nil {
		t.Fatalf("sidecar config: %v\n%s", err, config)
	}
	s, err := proxy.Start(context.Background(), cfg, proxy.Options{})
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
func viaSidecar(s *proxy.Sidecar) (*http.Client, *url.URL) {
	return &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}, &url.URL{Scheme: "http", Host: s.Addr()}
}

// holdingOrigin is an upstream whose /hold/NAME requests wait until
// release(NAME) (or the test's end), and whose other requests answer at
// once: work that holds its slot for as long as a test says.
type holdingOrigin struct {
	*httptest.Server
	mu    sync.Mutex
	gates map[string]chan struct{}
}

func newHoldingOrigin(t *testing.T) *holdingOrigin {
	t.Helper()
	o := &holdingOrigin{gates: map[string]chan struct{}{}}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := strings.CutPrefix(r.URL.Path, "/hold/"); ok {
			select {
			case <-o.gate(name):
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(o.Close)
	t.Cleanup(o.releaseAll) // runs first: the held requests end before the server closes
	return o
}

func (o *holdingOrigin) gate(name string) chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	g, ok := o.gates[name]
	if !ok {
		g = make(chan struct{})
		o.gates[name] = g
	}
	return g
}

// release lets /hold/NAME answer.
func (o *holdingOrigin) release(name string) { close(o.gate(name)) }

func (o *holdingOrigin) releaseAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, g := range o.gates {
		select {
		case <-g:
		default:
			close(g)
		}
		delete(o.gates, name)
	}
}

// send makes a GET through the sidecar's route /up/ in the background; the
// channel gets its status code (0 when it failed).
func send(client *http.Client, base *url.URL, path string) <-chan int {
	done := make(chan int, 1)
	go func() {
		resp, err := client.Get(base.String() + "/up" + path)
		if err != nil {
			done <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

// waitInspect polls governord's Inspect of node until ok says its answer is
// the one the test waits for, and returns it.
func waitInspect(t *testing.T, admin governorpb.GovernorClient, node int64, what string, ok func(*governorpb.Inspection) bool) *governorpb.Inspection {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		in, err := admin.Inspect(context.Background(), &governorpb.InspectRequest{NodeId: node})
		if err != nil {
			t.Fatal(err)
		}
		if ok(in) {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("governord never showed %s: %v", what, in.GetLeases())
		}
		time.Sleep(20 * time.Millisecond) // polling governord's answer, not waiting for readiness
	}
}

// blockOf is the block of class in in, or nil.
func blockOf(in *governorpb.Inspection, class string) *governorpb.LeaseInfo {
	for _, l := range in.GetLeases() {
		if l.GetBlock() && l.GetClass() == class {
			return l
		}
	}
	return nil
}
