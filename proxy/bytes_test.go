package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/logline"
)

// Bytes on the wire, against real governord and governor-proxy processes:
// a bytes rate shapes downloads, a bytes quota refuses a body of known
// length before it is forwarded, and a stream of unknown length is cut at
// its quota.

const mib = 1 << 20

// download is an origin that serves size bytes: with Content-Length, or
// (chunked) in flushed pieces of 32 KiB when streamed.
type download struct {
	size     int
	streamed bool
}

func (d download) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	piece := bytes.Repeat([]byte("x"), 32<<10)
	if !d.streamed {
		w.Header().Set("Content-Length", strconv.Itoa(d.size))
	}
	for left := d.size; left > 0; left -= len(piece) {
		if _, err := w.Write(piece[:min(left, len(piece))]); err != nil {
			return
		}
		if d.streamed {
			w.(http.Flusher).Flush()
		}
	}
}

// uploads is an origin that counts the requests that reach it and the
// bytes of their bodies.
type uploads struct{ requests, bytes atomic.Int64 }

func (u *uploads) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	n, _ := io.Copy(io.Discard, r.Body)
	u.bytes.Add(n)
}

// bytesGovernord is a governord process whose tenant's tasks each start
// with the caps given (a YAML mapping of quotas and rates), and no other.
func bytesGovernord(t *testing.T, defaults string) *govProc {
	return startGovProc(t, "tenants:\n  - {name: payments, api_key: "+tenantKey+", defaults: "+defaults+"}\n")
}

// TestBytesRateShapesDownloads: under a bytes rate of 1 MiB/s (burst 256
// KiB), a 10 MiB download takes 10 s ±10% through plain HTTP, through an
// intercepted tunnel and through a tunnel that is not intercepted. Each
// path runs through a sidecar of its own, whose task has a bucket of its
// own, so the three run at once.
func TestBytesRateShapesDownloads(t *testing.T) {
	if testing.Short() {
		t.Skip("10 s of shaped transfer")
	}
	g := bytesGovernord(t, "{rates: {egress_bytes: {rate: 1048576/s, burst: 262144}}}")
	const size = 10 * mib
	plain := originURL(t, download{size: size})
	secure := httptest.NewTLSServer(download{size: size})
	t.Cleanup(secure.Close)
	rule := "rules:\n  - {name: dl, match: {host: 127.0.0.1}, bytes: {resource: egress_bytes, count: response}}\n"
	caCert, caKey, caPool := caFiles(t)
	for _, tc := range []struct {
		name, url, http string
		roots           *x509.CertPool
	}{
		{"plain", plain + "/", "", nil},
		{"intercepted", secure.URL + "/", interceptYAML(caCert, caKey, certFile(t, secure), "127.0.0.1"), caPool},
		{"tunnel", secure.URL + "/", "", certPool(secure)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startSidecarProc(t, g, tenantKey, "pod-"+tc.name, tc.http+rule)
			tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: s.http}), TLSClientConfig: &tls.Config{RootCAs: tc.roots}}
			t.Cleanup(tr.CloseIdleConnections)
			c := &http.Client{Transport: tr, Timeout: time.Minute}
			began := time.Now()
			resp, err := c.Get(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			took := time.Since(began)
			if err != nil || n != size || resp.StatusCode != 200 {
				t.Fatalf("status %d, %d bytes, err %v; want 200 and %d bytes", resp.StatusCode, n, err, size)
			}
			t.Logf("%s: %d bytes in %v (%.2f MiB/s)", tc.name, n, took.Round(time.Millisecond), float64(n)/mib/took.Seconds())
			if took < 9*time.Second || took > 11*time.Second {
				t.Errorf("%s: 10 MiB took %v under 1 MiB/s, want 10 s ±10%%", tc.name, took)
			}
			series := `governor_proxy_bytes_total{direction="response",resource="egress_bytes",rule="dl"}`
			if got := s.metric(t, series); got < size {
				t.Errorf("%s = %v, want at least %d", series, got, size)
			}
		})
	}
}

// TestBytesQuotaRefusesAKnownLengthUpload: under a bytes quota of 5 MiB, an
// upload of 6 MiB with its Content-Length is refused (429 Governor-Denied:
// quota) before anything reaches the origin; one of 4 MiB passes, and
// governord counts its 4 MiB exactly.
func TestBytesQuotaRefusesAKnownLengthUpload(t *testing.T) {
	g := bytesGovernord(t, "{quotas: {egress_bytes: 5242880}}")
	o := &uploads{}
	u := originURL(t, o)
	s := startSidecarProc(t, g, tenantKey, "pod-up", `rules:
  - {name: up, match: {host: 127.0.0.1}, bytes: {resource: egress_bytes, count: request}}
`)
	c := s.client(t)
	post := func(size int) *http.Response {
		resp, err := c.Post(u+"/upload", "application/octet-stream", bytes.NewReader(make([]byte, size)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := post(6 * mib)
	if resp.StatusCode != 429 || resp.Header.Get("Governor-Denied") != "quota" {
		t.Fatalf("6 MiB: %s %v, want 429 Governor-Denied: quota", resp.Status, resp.Header)
	}
	if n := o.requests.Load(); n != 0 {
		t.Fatalf("the origin saw %d requests of an upload refused before forwarding", n)
	}
	if resp := post(4 * mib); resp.StatusCode != 200 {
		t.Fatalf("4 MiB: %s, want 200", resp.Status)
	}
	if n, b := o.requests.Load(), o.bytes.Load(); n != 1 || b != 4*mib {
		t.Fatalf("the origin saw %d requests, %d bytes; want 1 of 4 MiB", n, b)
	}
	series := `governor_proxy_bytes_total{direction="request",resource="egress_bytes",rule="up"}`
	if got := s.metric(t, series); got != 4*mib {
		t.Errorf("%s = %v, want %d", series, got, 4*mib)
	}
	a := newAdmin(t, g.addr)
	eventually(t, "governord counting the 4 MiB", func() bool {
		n := a.node("payments", "pod-up")
		return n != nil && n.GetUsed()["egress_bytes"] == 4*mib
	})
}

// TestBytesStreamCutAtQuota: a response of unknown length (chunked,
// flushed as it goes) under a bytes quota of 1 MiB is cut at the quota:
// the client gets no more than 1 MiB and then an error (not a clean end),
// the sidecar logs one line naming the rule, resource, bytes sent and
// limit, and counts the cut.
func TestBytesStreamCutAtQuota(t *testing.T) {
	g := bytesGovernord(t, "{quotas: {egress_bytes: 1048576}}")
	u := originURL(t, download{size: 4 * mib, streamed: true})
	s := startSidecarProc(t, g, tenantKey, "pod-cut", `rules:
  - {name: stream, match: {host: 127.0.0.1}, bytes: {resource: egress_bytes, count: response}}
`)
	resp, err := s.client(t).Get(u + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("the cut stream ended cleanly after %d bytes; want an error, so that the client knows it is short", n)
	}
	if n > mib || n < mib-64<<10 {
		t.Errorf("the client got %d bytes under a quota of %d", n, mib)
	}
	const msg = "governor-proxy: a transfer was cut: its bytes could not be charged"
	var line map[string]any
	eventually(t, "the cut's log line", func() bool {
		var ok bool
		line, ok = logline.Find(s.proc.logs.String(), msg)
		return ok
	})
	if line["rule"] != "stream" || line["resource"] != "egress_bytes" || line["cause"] != "quota" ||
		line["limit"] != float64(mib) || line["sent"] != float64(n) || line["direction"] != "response" {
		t.Errorf("log line %v, want rule stream, resource egress_bytes, cause quota, limit %d, sent %d", line, mib, n)
	}
	if c := strings.Count(s.proc.logs.String(), msg); c != 1 {
		t.Errorf("%d log lines of the cut, want 1", c)
	}
	series := `governor_proxy_bytes_cut_total{cause="quota",resource="egress_bytes",rule="stream"}`
	if got := s.metric(t, series); got != 1 {
		t.Errorf("%s = %v, want 1", series, got)
	}
	a := newAdmin(t, g.addr)
	if used := a.node("payments", "pod-cut").GetUsed()["egress_bytes"]; used > mib {
		t.Errorf("governord counts %d bytes under a quota of %d", used, mib)
	}
}

// TestBadBytesKeysExitTwo: the real governor-proxy given a bytes: or
// result: key it cannot use exits 2 naming the key, before it listens.
func TestBadBytesKeysExitTwo(t *testing.T) {
	bin := buildSidecar(t)
	for _, tc := range []struct{ rule, key string }{
		{"{name: dl, bytes: {resource: egress_bytes, count: sideways}}", "rules[0].bytes.count"},
		{"{name: dl, bytes: {resource: egress_bytes, chunk: 9223372036854775807}}", "rules[0].bytes.chunk"},
		{"{name: dl, bytes: {resource: egress_bytes, chunk: many}}", "rules[0].bytes.chunk"},
		{"{name: q, match: {sql: select}, result: {rows: r, bytes: r}}", "rules[0].result"},
	} {
		path := filepath.Join(t.TempDir(), "proxy.yaml")
		must(t, os.WriteFile(path, []byte("governor: {api_key: k-0123456789abcdef}\ntask: {name: pod-7}\nrules:\n  - "+tc.rule+"\n"), 0o600))
		var stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // one that starts runs until killed
		cmd := exec.CommandContext(ctx, bin, "-config", path)
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "config: "+tc.key) {
			t.Errorf("%s: got %v, want exit 2 naming %s\n%s", tc.rule, err, tc.key, stderr.String())
		}
	}
}
