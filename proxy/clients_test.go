package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Real clients, used as a worker would use them: Go's net/http reading
// HTTP_PROXY and HTTPS_PROXY, and curl.

const (
	childEnv     = "GOVERNOR_PROXY_TEST_CHILD" // set: this process is the client
	childURLsEnv = "GOVERNOR_PROXY_TEST_URLS"  // what the client gets, space separated
	childCAEnv   = "GOVERNOR_PROXY_TEST_CA"    // a PEM file the client trusts
)

// clientMain is the child process of TestProxyFromEnvironment: a plain Go
// program using http.ProxyFromEnvironment, exactly as a worker would.
// net/http reads the environment once per process (and the test process has
// long since read it, with other values), so the client runs in a process of
// its own, started with HTTP_PROXY and HTTPS_PROXY set.
func clientMain() int {
	pem, err := os.ReadFile(os.Getenv(childCAEnv))
	if err != nil {
		fmt.Println("ca:", err)
		return 1
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: &tls.Config{RootCAs: roots}}}
	for _, u := range strings.Fields(os.Getenv(childURLsEnv)) {
		resp, err := c.Get(u)
		if err != nil {
			fmt.Println(u, "error", err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(u, resp.StatusCode, string(b))
	}
	return 0
}

func TestProxyFromEnvironment(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	tlsO := origin(t, http.HandlerFunc(hello), true, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: env, match: {path: /env}, charge: {calls: 1}}
  - {name: tls, match: {host: example.com}, class: tunnel, charge: {tunnels: 1}}
`})
	a := newAdmin(t, g.Addr())
	// Go never proxies loopback targets (127.0.0.1, localhost), so the
	// origins are named with names only the proxy's resolver knows.
	urls := []string{hostURL(o, "origin.test") + "/env", hostURL(tlsO, "example.com") + "/env"}
	proxyURL := "http://crawl-7:@" + p.Addr()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childURLsEnv+"="+strings.Join(urls, " "), childCAEnv+"="+certFile(t, tlsO),
		"HTTP_PROXY="+proxyURL, "HTTPS_PROXY="+proxyURL, "http_proxy=", "https_proxy=", "NO_PROXY=", "no_proxy=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client: %v\n%s", err, out)
	}
	for _, u := range urls {
		if !strings.Contains(string(out), u+" 200 hello") {
			t.Errorf("the client did not get %s through the proxy:\n%s", u, out)
		}
	}
	p.settle()
	sub := a.node("payments", "pod-7", "crawl-7")
	if sub.GetUsed()["calls"] != 1 || sub.GetUsed()["tunnels"] != 1 {
		t.Errorf("subtask crawl-7 (from HTTP_PROXY's username) used %v, want calls 1 and tunnels 1", sub.GetUsed())
	}
}

func TestCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, n)
	}), false, false)
	tlsO := origin(t, http.HandlerFunc(hello), true, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
task: {name: pod-7, quotas: {never: 0}}
rules:
  - {name: denied-plain, match: {path: /denied}, charge: {never: 1}}
  - {name: denied-tunnel, match: {host: denied.test}, charge: {never: 1}}
  - {name: any, class: api, charge: {calls: 1}}
`})
	a := newAdmin(t, g.Addr())
	ca := certFile(t, tlsO)
	upload := filepath.Join(t.TempDir(), "upload.bin")
	if err := os.WriteFile(upload, bytes.Repeat([]byte("x"), 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	proxyURL := "http://crawl-8:@" + p.Addr()
	run := func(env []string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(curl, append([]string{"-sS", "--max-time", "10", "-w", "\n%{http_code}"}, args...)...)
		cmd.Env = append(os.Environ(), "http_proxy=", "https_proxy=", "HTTPS_PROXY=", "HTTP_PROXY=", "ALL_PROXY=", "NO_PROXY=", "no_proxy=")
		cmd.Env = append(cmd.Env, env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"-x plain", nil, []string{"-x", proxyURL, hostURL(o, "origin.test") + "/a"}, "GET /a 0\n200"},
		{"-x https (CONNECT)", nil, []string{"-x", proxyURL, "--cacert", ca, hostURL(tlsO, "example.com") + "/"}, "hello\n200"},
		// curl reads only the lower-case http_proxy (httpoxy), and either
		// case of HTTPS_PROXY.
		{"http_proxy", []string{"http_proxy=" + proxyURL}, []string{hostURL(o, "origin.test") + "/b"}, "GET /b 0\n200"},
		{"HTTPS_PROXY", []string{"HTTPS_PROXY=" + proxyURL}, []string{"--cacert", ca, hostURL(tlsO, "example.com") + "/"}, "hello\n200"},
		{"upload with Expect: 100-continue", nil, []string{"-x", proxyURL, "-H", "Expect: 100-continue", "-T", upload, hostURL(o, "origin.test") + "/up"},
			fmt.Sprintf("PUT /up %d\n200", 2<<20)},
	} {
		out, errOut, code := run(tc.env, tc.args...)
		if code != 0 || out != tc.want {
			t.Errorf("%s: exit %d, out %q, want %q; stderr %s", tc.name, code, out, tc.want, errOut)
		}
	}
	out, _, _ := run(nil, "-x", proxyURL, "-i", hostURL(o, "origin.test")+"/denied")
	if !strings.Contains(out, "HTTP/1.1 429") || !strings.Contains(out, "Governor-Denied: quota") || !strings.Contains(out, `"cap":"never"`) {
		t.Errorf("curl on a spent quota:\n%s", out)
	}
	_, errOut, code := run(nil, "-x", proxyURL, "https://denied.test/")
	if code != 56 || !strings.Contains(errOut, "429") {
		t.Errorf("curl CONNECT on a spent quota: exit %d, stderr %q", code, errOut)
	}
	p.settle()
	if used := a.node("payments", "pod-7", "crawl-8").GetUsed()["calls"]; used != 5 {
		t.Errorf("calls charged to crawl-8: %d, want 5", used)
	}
}
