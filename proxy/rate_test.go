package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestRateRefusalIsRateOnTheWire: a request refused by a rate governord
// keeps is answered as the table of denials says for a rate: 429,
// Governor-Denied: rate, X-Should-Retry: true and a Retry-After of the
// seconds until the rate has room (it was 503 unavailable: the sidecar
// did not know the SDK's ErrRateLimited).
func TestRateRefusalIsRateOnTheWire(t *testing.T) {
	for _, delegation := range []string{"true", "false"} {
		t.Run("delegation "+delegation, func(t *testing.T) { testRateOnTheWire(t, delegation) })
	}
}

func testRateOnTheWire(t *testing.T, delegation string) {
	g := startGovernord(t, func(c *serverconfig.Config) {
		c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 2, Per: int64(time.Hour)}}
	})
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
delegation: {enabled: ` + delegation + `}
rules:
  - {name: api, match: {host: origin.test}, charge: {calls: 1}}
`})
	c := p.client("", nil)
	var codes []int
	var last *http.Response
	var body []byte
	for range 3 {
		resp, err := c.Get(hostURL(o, "origin.test") + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		codes, last = append(codes, resp.StatusCode), resp
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("statuses %v, want 200 200 429 under a rate of 2 calls an hour", codes)
	}
	h := last.Header
	if h.Get(httpproxy.HeaderDenied) != "rate" || h.Get("X-Should-Retry") != "true" {
		t.Errorf("headers %v, want Governor-Denied: rate and X-Should-Retry: true", h)
	}
	// Two an hour: the next unit is there 30 minutes after the first.
	if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s < 25*60 || s > 30*60 {
		t.Errorf("Retry-After %q, want the seconds until the rate has room (about 1,800)", h.Get("Retry-After"))
	}
	var b struct {
		Error struct{ Cause, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &b); err != nil || b.Error.Cause != "rate" {
		t.Errorf("body %s, want cause rate", body)
	}
	t.Logf("%s", b.Error.Message)
}

// rateGet GETs the origin through the sidecar, and returns the status, the
// Retry-After header and how long the answer took.
func rateGet(t *testing.T, c *http.Client, url string) (int, string, time.Duration) {
	t.Helper()
	began := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(began)
}

// TestRatePacesWithinTheWaitTimeout: a request over a rate waits until the
// rate has room, within http.wait_timeout, and goes on (on_rate: wait, the
// default): under 4 calls a second with no unit left, each of the next
// requests is answered about a quarter of a second after the one before,
// with 200, and counted as paced.
func TestRatePacesWithinTheWaitTimeout(t *testing.T) {
	for _, delegation := range []string{"true", "false"} {
		t.Run("delegation "+delegation, func(t *testing.T) {
			g := startGovernord(t, func(c *serverconfig.Config) {
				c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 4, Per: int64(time.Second)}}
			})
			o := origin(t, http.HandlerFunc(hello), false, false)
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
delegation: {enabled: ` + delegation + `}
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], wait_timeout: 5s}
rules:
  - {name: api, match: {host: origin.test}, charge: {calls: 1}}
`})
			c := p.client("", nil)
			began := time.Now()
			for i := range 8 {
				if code, _, _ := rateGet(t, c, hostURL(o, "origin.test")+"/"); code != 200 {
					t.Fatalf("request %d: status %d, want 200 after a wait", i, code)
				}
			}
			// 4 at once (the burst), then 4 more at 250ms each.
			if took := time.Since(began); took < 900*time.Millisecond || took > 3*time.Second {
				t.Errorf("8 requests took %v, want about 1s under 4 a second", took)
			}
			if n := p.metric(`governor_proxy_paced_total{resource="calls",status="admitted"}`); n < 3 {
				t.Errorf("governor_proxy_paced_total admitted = %v, want at least 3", n)
			}
		})
	}
}

// TestRateOnRateDenyRefusesAtOnce: a rule with on_rate: deny refuses a
// request over its rate at once, as before pacing, though the rate has
// room again within the wait timeout.
func TestRateOnRateDenyRefusesAtOnce(t *testing.T) {
	g := startGovernord(t, func(c *serverconfig.Config) {
		c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 1, Per: int64(time.Second)}}
	})
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], wait_timeout: 30s}
rules:
  - {name: api, match: {host: origin.test}, charge: {calls: 1}, on_rate: deny}
`})
	c := p.client("", nil)
	if code, _, _ := rateGet(t, c, hostURL(o, "origin.test")+"/"); code != 200 {
		t.Fatalf("first request: status %d, want 200", code)
	}
	code, retry, took := rateGet(t, c, hostURL(o, "origin.test")+"/")
	if code != 429 || retry != "1" {
		t.Fatalf("second request: status %d, Retry-After %q; want 429 with Retry-After 1", code, retry)
	}
	if took > 500*time.Millisecond {
		t.Errorf("the refusal took %v, want at once (the rate has room in under a second)", took)
	}
}

// TestRatePacingRefusesAWaitThatCannotFit: a request whose wait for the
// rate is longer than its wait timeout is refused for rate at once, with
// the wait as Retry-After, not after sleeping out its wait timeout.
func TestRatePacingRefusesAWaitThatCannotFit(t *testing.T) {
	g := startGovernord(t, func(c *serverconfig.Config) {
		c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 1, Per: int64(10 * time.Second)}}
	})
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], wait_timeout: 3s}
rules:
  - {name: api, match: {host: origin.test}, charge: {calls: 1}}
`})
	c := p.client("", nil)
	if code, _, _ := rateGet(t, c, hostURL(o, "origin.test")+"/"); code != 200 {
		t.Fatalf("first request: status %d, want 200", code)
	}
	code, retry, took := rateGet(t, c, hostURL(o, "origin.test")+"/")
	s, _ := strconv.Atoi(retry)
	if code != 429 || s < 8 || s > 10 {
		t.Fatalf("second request: status %d, Retry-After %q; want 429 with Retry-After about 10", code, retry)
	}
	if took > time.Second {
		t.Errorf("the refusal took %v, want at once: 10s of wait cannot fit in 3s", took)
	}
	if n := p.metric(`governor_proxy_paced_total{resource="calls",status="refused"}`); n != 1 {
		t.Errorf("governor_proxy_paced_total refused = %v, want 1", n)
	}
}

// TestBadOnRateExitsTwo: the real governor-proxy given an on_rate that is
// neither wait nor deny exits 2 naming the key, before it listens.
func TestBadOnRateExitsTwo(t *testing.T) {
	bin := buildSidecar(t)
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	must(t, os.WriteFile(path, []byte("governor: {api_key: k-0123456789abcdef}\ntask: {name: pod-7}\n"+
		"rules:\n  - {name: api, charge: {calls: 1}, on_rate: later}\n"), 0o600))
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // one that starts runs until killed
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-config", path)
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "config: rules[0].on_rate") {
		t.Errorf("got %v, want exit 2 naming rules[0].on_rate\n%s", err, stderr.String())
	}
}
