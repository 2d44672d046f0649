package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/proxy/intercept"
)

// The interception runs of the sidecar scenario: HTTPS through the
// sidecar's interception (http.intercept) against bare goproxy doing MITM
// with the same CA, both given a cache of leaf certificates so that the
// steady state is compared (goproxy has none by default). The load client
// is govbench's own (https-load, a process of its own): wrk has no proxy
// support for HTTPS. Everything speaks HTTP/1.1, keep-alive, 1 KiB
// responses from an HTTPS origin on loopback.
//
//   - https: requests/s and p50 at each client count, and the proxy's CPU
//     per request;
//   - https-first: the first request to a new host (a leaf minted, the
//     client's and the upstream's handshakes) against a new connection to
//     a host whose leaf is cached, each on a fresh client connection;
//   - https-conns: the memory an open intercepted connection holds (the
//     proxy's RSS with firstHosts connections open and idle, less before).

// firstHosts is how many hosts the first-request runs mint leaves for
// (127.0.0.2 on): every loopback address reaches the origin.
const firstHosts = 200

// httpsSetup makes the CAs and the origin's certificate, and starts the
// HTTPS origin, the goproxy MITM and the intercepting sidecar.
func (b *sidecarBench) httpsSetup(governed string, g *daemon) error {
	later := func(f func()) { b.stops = append(b.stops, f) }
	dir := filepath.Join(b.dir, "https")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b.caCert, b.caKey = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	c, k, err := intercept.NewCA(intercept.CAOptions{Name: "govbench interception CA"})
	if err != nil {
		return err
	}
	originCert, originKey, originCA, err := originCertificate(firstHosts + 1)
	if err != nil {
		return err
	}
	for f, data := range map[string][]byte{b.caCert: c, b.caKey: k, filepath.Join(dir, "origin.pem"): originCert,
		filepath.Join(dir, "origin-key.pem"): originKey, filepath.Join(dir, "origin-ca.pem"): originCA} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			return err
		}
	}
	for _, o := range []struct {
		into *string
		args []string
	}{{&b.httpsOrigin, nil}, {&b.httpsOriginH2, []string{"-h2"}}} {
		p, addr, err := startSelf("serve-origin", append([]string{"-tls-cert", filepath.Join(dir, "origin.pem"),
			"-tls-key", filepath.Join(dir, "origin-key.pem")}, o.args...)...)
		if err != nil {
			return err
		}
		later(p.stop)
		*o.into = addr
	}
	gp, addr, err := startSelf("serve-goproxy", "-mitm-cert", b.caCert, "-mitm-key", b.caKey, "-upstream-ca", filepath.Join(dir, "origin-ca.pem"))
	if err != nil {
		return err
	}
	later(gp.stop)
	b.httpsGoproxy, b.httpsGoproxyCPU, b.httpsGoproxyPID = addr, gp.cpu, gp.cmd.Process.Pid
	hosts := make([]string, 0, firstHosts+1)
	for i := 1; i <= firstHosts+1; i++ {
		hosts = append(hosts, fmt.Sprintf("127.0.0.%d", i))
	}
	s, err := startSidecarHTTP(b.proxy, b.dir, "gov-https", fmt.Sprintf(
		"{listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], intercept: {hosts: [%s], ca_cert: %s, ca_key: %s, upstream_ca_file: %s}}",
		strings.Join(hosts, ", "), b.caCert, b.caKey, filepath.Join(dir, "origin-ca.pem")),
		b.sidecarYAML(g, heavyKey, "gov-https")+governed)
	if err != nil {
		return err
	}
	later(s.stop)
	b.httpsSidecar = s
	return nil
}

// originCertificate is a CA and a certificate it signed for 127.0.0.1 to
// 127.0.0.n, as PEM.
func originCertificate(n int) (certPEM, keyPEM, caPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "govbench origin CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "govbench origin"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for i := 1; i <= n; i++ {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IPv4(127, 0, 0, byte(i)))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// httpsTargets are the interception runs' targets, in the order each
// round runs them.
//
// The origin speaks HTTP/1.1 only, as bare goproxy's transport does to
// upstreams: the comparison is of the proxies, not of the protocols. The
// sidecar negotiates HTTP/2 with upstreams that offer it; gov-https-h2up is
// it against an origin that does, to show what that costs.
func (b *sidecarBench) httpsTargets() []string {
	return []string{"direct", "goproxy-mitm", "gov-https", "gov-https-h2up"}
}

func (b *sidecarBench) httpsProxy(name string) (addr string, cpu func() time.Duration, pid int) {
	switch name {
	case "goproxy-mitm":
		return b.httpsGoproxy, b.httpsGoproxyCPU, b.httpsGoproxyPID
	case "gov-https", "gov-https-h2up":
		return b.httpsSidecar.addr, b.httpsSidecar.cpu, b.httpsSidecar.cmd.Process.Pid
	}
	return "", nil, 0
}

// httpsLoadResult is what https-load prints.
type httpsLoadResult struct {
	Rate   float64 `json:"rps"`
	P50us  float64 `json:"p50_us"`
	Reqs   int64   `json:"requests"`
	Errors int64   `json:"errors"`
	// For -first: the p50 of a first request to a new host, and of a new
	// connection to a host already seen.
	NewHostP50us    float64 `json:"new_host_p50_us,omitempty"`
	CachedHostP50us float64 `json:"cached_host_p50_us,omitempty"`
}

// httpsLoadRun runs https-load through the named target.
func (b *sidecarBench) httpsLoadRun(name string, args ...string) (httpsLoadResult, error) {
	proxy, _, _ := b.httpsProxy(name)
	self, err := os.Executable()
	if err != nil {
		return httpsLoadResult{}, err
	}
	ca := b.caCert
	if name == "direct" {
		ca = filepath.Join(b.dir, "https", "origin-ca.pem")
	}
	origin := b.httpsOrigin
	if name == "gov-https-h2up" {
		origin = b.httpsOriginH2
	}
	cmd := exec.Command(self, append([]string{"https-load", "-proxy", proxy, "-ca", ca, "-origin", origin}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		return httpsLoadResult{}, fmt.Errorf("https-load: %v: %s", err, lastLines(string(out), 3))
	}
	var r httpsLoadResult
	err = json.Unmarshal(out, &r)
	return r, err
}

// https runs the keep-alive load through one target.
func (b *sidecarBench) https(name string, clients, round int) {
	_, cpu, _ := b.httpsProxy(name)
	var cpu0 time.Duration
	if cpu != nil {
		cpu0 = cpu()
	}
	r, err := b.httpsLoadRun(name, "-c", strconv.Itoa(clients), "-d", fmt.Sprint(time.Duration(b.seconds)*time.Second))
	if err == nil && r.Errors > 0 {
		err = fmt.Errorf("%d requests failed", r.Errors)
	}
	if err != nil {
		b.printf("https 1 KiB %-12s c=%-3d round %d: FAILED: %v\n", name, clients, round, err)
		return
	}
	s := sample{Kind: "https", Target: name, Clients: clients, Round: round, Rate: r.Rate, P50us: r.P50us}
	if cpu != nil && r.Reqs > 0 {
		s.CPUus = float64(cpu()-cpu0) / float64(r.Reqs) / 1e3
	}
	b.samples = append(b.samples, s)
	b.printf("https 1 KiB %-12s c=%-3d round %d: %8.0f req/s  p50 %6.0f µs  %s\n", name, clients, round, r.Rate, r.P50us, cpuNote(s.CPUus, "request"))
}

// httpsFirst measures the first request to new hosts through a target,
// against new connections to hosts already seen. Each round uses hosts of
// its own, so that every first request mints.
func (b *sidecarBench) httpsFirst(name string, round, perRound int) {
	from := 2 + (round-1)*perRound
	r, err := b.httpsLoadRun(name, "-first", strconv.Itoa(from), "-hosts", strconv.Itoa(perRound))
	if err != nil {
		b.printf("https first %-12s round %d: FAILED: %v\n", name, round, err)
		return
	}
	b.samples = append(b.samples, sample{Kind: "https-first", Target: name, Round: round, P50us: r.NewHostP50us, Rate: r.CachedHostP50us})
	b.printf("https first %-12s round %d: a new host p50 %6.0f µs, a cached host p50 %6.0f µs, added %6.0f µs\n",
		name, round, r.NewHostP50us, r.CachedHostP50us, r.NewHostP50us-r.CachedHostP50us)
}

// httpsConns measures what open, idle intercepted connections hold: the
// proxy's RSS with n open, less its RSS before they were opened.
func (b *sidecarBench) httpsConns(name string, n int) {
	proxy, _, pid := b.httpsProxy(name)
	pool, err := caPool(b.caCert)
	if err != nil {
		b.printf("https conns %-12s: FAILED: %v\n", name, err)
		return
	}
	before := rssOf(pid)
	var clients []*http.Transport
	defer func() {
		for _, tr := range clients {
			tr.CloseIdleConnections()
		}
	}()
	for range n {
		tr := httpsTransport(proxy, pool, 1)
		clients = append(clients, tr)
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + b.httpsOrigin + "/")
		if err != nil {
			b.printf("https conns %-12s: FAILED: %v\n", name, err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	time.Sleep(time.Second) // let the proxy's reads settle; RSS is read, not a readiness
	after := rssOf(pid)
	per := float64(after-before) / float64(n)
	b.samples = append(b.samples, sample{Kind: "https-conns", Target: name, Clients: n, Rate: per})
	b.printf("https conns %-12s: %d open: RSS %.1f MiB -> %.1f MiB, %.1f KiB a connection\n", name, n,
		float64(before)/(1<<20), float64(after)/(1<<20), per/1024)
}

// rssOf is a process's resident set, in bytes.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func caPool(file string) (*x509.CertPool, error) {
	pemData, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("%s holds no certificate", file)
	}
	return pool, nil
}

// httpsTransport is an HTTP/1.1 keep-alive client through proxy (none if
// ""), trusting pool.
func httpsTransport(proxy string, pool *x509.CertPool, conns int) *http.Transport {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
		DisableCompression: true, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	if proxy != "" {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: proxy})
	}
	return tr
}

// httpsReport prints the interception runs' tables.
func (b *sidecarBench) httpsReport(w io.Writer) {
	fmt.Fprintln(w, "https 1 KiB\tclients\treq/s, median (range)\t/goproxy-mitm\tp50 µs\tadded p50 µs\tadded p50 /goproxy-mitm's\tmiddle CPU/req µs")
	for _, c := range b.clientCounts("https") {
		direct := statOf(b.values("https", "direct", c, p50)).med
		base := statOf(b.values("https", "goproxy-mitm", c, p50)).med - direct
		for _, name := range b.httpsTargets() {
			added := statOf(b.values("https", name, c, p50)).med - direct
			rel := "-"
			if name != "direct" && base > 0 {
				rel = fmt.Sprintf("%.2f", added/base)
			}
			fmt.Fprintf(w, "%s\t%d\t%v\t%s\t%v\t%.0f\t%s\t%v\n", name, c, statOf(b.values("https", name, c, rate)),
				b.ratio("https", name, "goproxy-mitm", c, rate), statOf(b.values("https", name, c, p50)), added, rel,
				statOf(b.values("https", name, c, cpu)))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "https first request\tnew host p50 µs\tcached host p50 µs\tadded by a new host µs")
	for _, name := range []string{"goproxy-mitm", "gov-https"} {
		var added []float64
		for _, s := range b.samples {
			if s.Kind == "https-first" && s.Target == name {
				added = append(added, s.P50us-s.Rate)
			}
		}
		if len(added) == 0 {
			continue
		}
		fmt.Fprintf(w, "%s\t%v\t%v\t%v\n", name, statOf(b.values("https-first", name, 0, p50)),
			statOf(b.values("https-first", name, 0, rate)), statOf(added))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "https open connections\tconnections\tKiB each")
	for _, name := range []string{"goproxy-mitm", "gov-https"} {
		for _, s := range b.samples {
			if s.Kind == "https-conns" && s.Target == name {
				fmt.Fprintf(w, "%s\t%d\t%.1f\n", name, s.Clients, s.Rate/1024)
			}
		}
	}
	fmt.Fprintln(w)
}

// httpsLoad is the HTTPS load client (a hidden mode, run as a process of
// its own): -c keep-alive HTTP/1.1 connections through -proxy to -origin
// for -d, each request timed; or, with -first, a first request to each of
// -hosts new hosts (127.0.0.FIRST on) and a second new connection to each,
// timed apart. It prints one JSON object.
func httpsLoad(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("https-load", stderr)
	proxy := fs.String("proxy", "", "the proxy's address; empty: straight to the origin")
	caFile := fs.String("ca", "", "the CA to trust (PEM)")
	origin := fs.String("origin", "", "the origin's host:port")
	conns := fs.Int("c", 1, "connections")
	dur := fs.Duration("d", 10*time.Second, "how long")
	first := fs.Int("first", 0, "measure first requests to hosts 127.0.0.FIRST on, instead of a load")
	hosts := fs.Int("hosts", 50, "with -first: how many hosts")
	if fs.Parse(args) != nil {
		return 2
	}
	pool, err := caPool(*caFile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	var r httpsLoadResult
	if *first > 0 {
		r, err = firstRequests(*proxy, pool, *origin, *first, *hosts)
	} else {
		r, err = keepAliveLoad(*proxy, pool, *origin, *conns, *dur)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	json.NewEncoder(stdout).Encode(r)
	return 0
}

func keepAliveLoad(proxy string, pool *x509.CertPool, origin string, conns int, dur time.Duration) (httpsLoadResult, error) {
	tr := httpsTransport(proxy, pool, conns)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	target := "https://" + origin + "/"
	get := func() error {
		resp, err := client.Get(target)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	// Every connection is open before the clock starts.
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- get() }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return httpsLoadResult{}, fmt.Errorf("warming up: %w", err)
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	var failed int64
	start := time.Now()
	end := start.Add(dur)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			var bad int64
			for time.Now().Before(end) {
				t0 := time.Now()
				if err := get(); err != nil {
					bad++
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			failed += bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(lat) == 0 {
		return httpsLoadResult{Errors: failed}, errors.New("no request succeeded")
	}
	return httpsLoadResult{Rate: float64(len(lat)) / elapsed.Seconds(), P50us: medianMicros(lat), Reqs: int64(len(lat)), Errors: failed}, nil
}

func firstRequests(proxy string, pool *x509.CertPool, origin string, first, hosts int) (httpsLoadResult, error) {
	_, port, err := net.SplitHostPort(origin)
	if err != nil {
		return httpsLoadResult{}, err
	}
	once := func(host string) (time.Duration, error) {
		tr := httpsTransport(proxy, pool, 1)
		defer tr.CloseIdleConnections()
		t0 := time.Now()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + net.JoinHostPort(host, port) + "/")
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("%s: status %d", host, resp.StatusCode)
		}
		return time.Since(t0), nil
	}
	var fresh, cached []time.Duration
	for i := range hosts {
		host := fmt.Sprintf("127.0.0.%d", first+i)
		d, err := once(host)
		if err != nil {
			return httpsLoadResult{}, err
		}
		fresh = append(fresh, d)
		if d, err = once(host); err != nil {
			return httpsLoadResult{}, err
		}
		cached = append(cached, d)
	}
	return httpsLoadResult{NewHostP50us: medianMicros(fresh), CachedHostP50us: medianMicros(cached)}, nil
}

func medianMicros(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Microsecond)
}

// serveGoproxyMITM is bare goproxy doing MITM for every CONNECT with the
// CA in certFile and keyFile, caching the leaves it signs, and trusting
// upstreamCA for the origin.
func serveGoproxyMITM(certFile, keyFile, upstreamCA string, stdout, stderr io.Writer) int {
	ca, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	pool, err := caPool(upstreamCA)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = log.New(io.Discard, "", 0)
	gp.CertStore = &testcert.LeafCache{}
	gp.Tr = &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, TLSClientConfig: &tls.Config{RootCAs: pool}}
	mitm := &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: goproxy.TLSConfigFromCA(&ca)}
	gp.OnRequest().HandleConnect(goproxy.FuncHttpsHandler(func(host string, _ *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		return mitm, host
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, ln.Addr())
	return serveUntilKilled(ln, gp, stderr)
}
