package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/server"
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
	g := startGovernord(t, func(c *server.Config) {
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
