package httpproxy_test

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/proxy/httpproxy"
)

func passwordProxy(t *testing.T, adm *fakeAdmitter, password string) *url.URL {
	t.Helper()
	rs, err := classify.Parse([]byte("rules:\n  - {name: any, class: api}\n"))
	if err != nil {
		t.Fatal(err)
	}
	local, _ := httpproxy.ParseTarget("localhost")
	p := &httpproxy.Proxy{Admitter: adm, Rules: func() *classify.Rules { return rs }, Resolver: loopback{},
		Config: httpproxy.Config{WaitTimeout: time.Second, AllowTargets: local, Password: password,
			ConnectPorts: []httpproxy.PortRange{{Lo: 1, Hi: 65535}}}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u
}

// rawConnect sends a CONNECT with the given Proxy-Authorization and
// returns the proxy's answer.
func rawConnect(t *testing.T, proxy, target, auth string) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	if auth != "" {
		fmt.Fprintf(c, "Proxy-Authorization: %s\r\n", auth)
	}
	io.WriteString(c, "\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestPasswordRequired(t *testing.T) {
	o := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	defer o.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(o.URL, "http://"))
	adm := &fakeAdmitter{}
	proxy := passwordProxy(t, adm, "pw:with:colons")
	basic := func(userpass string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(userpass)) }
	for _, auth := range []string{"", basic("crawl-7:"), basic("crawl-7:pw"), basic("crawl-7:pw:with:colon"), "Basic !!", "Bearer pw:with:colons"} {
		req, _ := http.NewRequest(http.MethodGet, "http://origin.test:"+port+"/", nil)
		if auth != "" {
			req.Header.Set("Proxy-Authorization", auth)
		}
		resp, err := (&http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusProxyAuthRequired || resp.Header.Get("Proxy-Authenticate") != `Basic realm="governor-proxy"` ||
			resp.Header.Get(httpproxy.HeaderDenied) != "proxy-auth" {
			t.Errorf("%q: %d %v", auth, resp.StatusCode, resp.Header)
		}
		if cr := rawConnect(t, proxy.Host, "origin.test:"+port, auth); cr.StatusCode != http.StatusProxyAuthRequired ||
			cr.Status != "407 Proxy Authentication Required" || cr.Header.Get("Proxy-Authenticate") == "" {
			t.Errorf("CONNECT %q: %s %v", auth, cr.Status, cr.Header)
		}
	}
	if len(adm.asked) != 0 {
		t.Fatalf("requests without the password were admitted: %+v", adm.asked)
	}
	u := *proxy
	u.User = url.UserPassword("crawl-7", "pw:with:colons")
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&u)}}).Get("http://origin.test:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello" || len(adm.asked) != 1 || adm.asked[0].Subtask != "crawl-7" {
		t.Errorf("with the password: %d %q, asked %+v", resp.StatusCode, body, adm.asked)
	}
	if cr := rawConnect(t, proxy.Host, "origin.test:"+port, basic("crawl-7:pw:with:colons")); cr.StatusCode != 200 {
		t.Errorf("CONNECT with the password: %s", cr.Status)
	}
}
