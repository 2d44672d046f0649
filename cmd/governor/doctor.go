package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"
)

const doctorUsage = `usage: governor doctor [-config governord.yaml] [-proxy-config proxy.yaml]... [-json] [flags]

Checks that governord can be reached (TLS, clock skew), lints the
configuration files given (every error and warning at once), looks over the
tree the key can see (caps, leases, heartbeats, waiters, quotas), dials
each pgwire upstream of the sidecar configs and checks the CA of their
http.intercept (expiry, key permissions, that the key matches). It exits 1
when anything is wrong, 2 on bad flags, and says how to fix each finding.

flags:
`

// Finding levels.
const (
	levelOK    = "ok"
	levelWarn  = "warn"
	levelError = "error"
)

// finding is one thing doctor found, and how to fix it.
type finding struct {
	Check   string `json:"check"`
	Level   string `json:"level"`
	Subject string `json:"subject,omitempty"`
	Problem string `json:"problem"`
	Fix     string `json:"fix,omitempty"`
}

type doctorOptions struct {
	config         string
	proxyConfigs   []string
	leaseAge       time.Duration
	heartbeatGrace time.Duration
	waitTimeout    time.Duration
	nearQuota      float64
	maxSkew        time.Duration
	maxNodes       int
	timeout        time.Duration
	certWarn       time.Duration
	caWarn         time.Duration
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func doctor(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, doctorUsage); fs.PrintDefaults() }
	var o doctorOptions
	var proxies listFlag
	fs.StringVar(&o.config, "config", "", "governord's configuration file to lint")
	fs.Var(&proxies, "proxy-config", "a governor-proxy configuration file to lint and whose pgwire upstreams to dial (repeatable)")
	asJSON := fs.Bool("json", false, "print the findings as JSON")
	fs.DurationVar(&o.leaseAge, "lease-age", 10*time.Minute, "a lease held longer than this is a finding")
	fs.DurationVar(&o.heartbeatGrace, "heartbeat-grace", time.Second, "a session is late when its last heartbeat is older than a third of its TTL plus this")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 0, "a waiter queued longer than this is a finding (default: the sidecar configs' http.wait_timeout, else 30s)")
	fs.Float64Var(&o.nearQuota, "near-quota", 0.9, "a tenant whose use of a quota reaches this share of it is a finding")
	fs.DurationVar(&o.maxSkew, "max-skew", 2*time.Second, "the largest clock difference from governord that is fine")
	fs.IntVar(&o.maxNodes, "max-nodes", 20000, "the most nodes of the tree to look over")
	fs.DurationVar(&o.timeout, "timeout", dialTimeout, "how long to try to reach governord")
	fs.DurationVar(&o.certWarn, "cert-warn", 14*24*time.Hour, "a governord certificate that expires sooner than this is a finding")
	fs.DurationVar(&o.caWarn, "ca-warn", 7*24*time.Hour, "an interception CA (a sidecar config's http.intercept) that expires sooner than this is a finding")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.proxyConfigs = proxies
	if fs.NArg() > 0 || o.nearQuota <= 0 || o.nearQuota > 1 || o.leaseAge <= 0 || o.heartbeatGrace < 0 || o.waitTimeout < 0 || o.maxSkew < 0 || o.timeout <= 0 || o.certWarn < 0 || o.caWarn < 0 {
		fmt.Fprintln(stderr, "governor doctor: bad arguments: -near-quota is in (0, 1], durations are positive, and no positional arguments")
		return 2
	}
	findings := runDoctor(context.Background(), o)
	bad := false
	for _, f := range findings {
		bad = bad || f.Level != levelOK
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			OK       bool      `json:"ok"`
			Findings []finding `json:"findings"`
		}{!bad, findings})
	} else {
		printFindings(stdout, findings)
	}
	if bad {
		return 1
	}
	return 0
}

func printFindings(out io.Writer, findings []finding) {
	problems := 0
	for _, f := range findings {
		subject := ""
		if f.Subject != "" {
			subject = f.Subject + ": "
		}
		fmt.Fprintf(out, "%-5s %-12s %s%s\n", strings.ToUpper(f.Level), f.Check, subject, f.Problem)
		if f.Fix != "" {
			fmt.Fprintf(out, "      %-12s fix: %s\n", "", f.Fix)
		}
		if f.Level != levelOK {
			problems++
		}
	}
	if problems == 0 {
		fmt.Fprintln(out, "all checks passed")
	} else {
		fmt.Fprintf(out, "%d problem(s) found\n", problems)
	}
}

func runDoctor(ctx context.Context, o doctorOptions) []finding {
	var out []finding
	var gcfg *serverconfig.Config
	if o.config != "" {
		cfg, err := serverconfig.LoadConfig(o.config)
		if err != nil {
			fix := "correct the key named; governord refuses to start with this file"
			if _, perr := proxyconfig.LoadClassification(o.config); perr == nil {
				fix = "this is governor-proxy's configuration: lint it with -proxy-config " + o.config + " (-config is governord's)"
			}
			out = append(out, finding{Check: "config", Level: levelError, Subject: o.config, Problem: err.Error(), Fix: fix})
		} else {
			gcfg = &cfg
			out = append(out, finding{Check: "config", Level: levelOK, Subject: o.config, Problem: "loads"})
		}
	}
	var proxies []proxyFile
	for _, path := range o.proxyConfigs {
		p, fs := lintProxy(path)
		out = append(out, fs...)
		if p != nil {
			proxies = append(proxies, *p)
			if o.waitTimeout == 0 && p.cfg.HTTP.WaitTimeout > 0 {
				o.waitTimeout = p.cfg.HTTP.WaitTimeout
			}
		}
	}
	if o.waitTimeout == 0 {
		o.waitTimeout = proxyconfig.DefaultWaitTimeout
	}
	for _, p := range proxies {
		out = append(out, checkUpstreams(ctx, p)...)
		out = append(out, checkInterceptCA(p, time.Now(), o.caWarn)...)
	}
	gov, tree := checkGovernord(ctx, o)
	out = append(out, gov...)
	// The rules are checked against the caps in force when governord can
	// say them (caps set live count), else against its config file.
	var caps *capNames
	switch {
	case tree != nil:
		caps = liveCaps(tree)
	case gcfg != nil:
		caps = configCaps(gcfg)
	}
	if caps != nil {
		for _, p := range proxies {
			out = append(out, lintAgainstCaps(p, caps)...)
		}
	}
	return out
}

// checkGovernord connects, times governord's clock and looks over the tree,
// which it returns (nil when it could not be read).
func checkGovernord(ctx context.Context, o doctorOptions) ([]finding, *treeWalk) {
	addr := os.Getenv(governor.EnvAddr)
	if addr == "" {
		addr = governor.DefaultAddr
	}
	out := checkTransport(addr, o.certWarn)
	c, err := connectWithin(ctx, o.timeout)
	if err != nil {
		return append(out, finding{Check: "connectivity", Level: levelError, Subject: addr, Problem: err.Error(),
			Fix: "start governord, or point GOVERNOR_ADDR at it; check GOVERNOR_API_KEY, GOVERNOR_TLS and GOVERNOR_CA_FILE"}), nil
	}
	defer c.Close()
	out = append(out, finding{Check: "connectivity", Level: levelOK, Subject: addr, Problem: "a session opened"})
	rpc := c.Raw()
	sent := time.Now()
	in, err := rpc.Inspect(ctx, &governorpb.InspectRequest{NodeId: c.ScopeID()})
	received := time.Now()
	if err != nil {
		return append(out, finding{Check: "connectivity", Level: levelError, Subject: addr, Problem: "Inspect: " + plainStatus(err).Error(),
			Fix: "governord may be older than this CLI; upgrade it"}), nil
	}
	out = append(out, skewFinding(sent, received, in.GetServerTime().AsTime(), o.maxSkew))
	tree, w := checkTree(ctx, rpc, c.ScopeID(), o)
	out = append(out, tree...)
	out = append(out, checkInspection(in, w, o)...)
	return out, w
}

// skewFinding compares governord's clock with this one: the server read its
// clock somewhere between sent and received.
func skewFinding(sent, received, server time.Time, maxSkew time.Duration) finding {
	mid := sent.Add(received.Sub(sent) / 2)
	skew := server.Sub(mid)
	slack := received.Sub(sent) / 2
	if abs(skew)-slack > maxSkew {
		return finding{Check: "clock", Level: levelWarn, Problem: fmt.Sprintf("governord's clock is %v off this one's (more than %v)", skew.Round(time.Millisecond), maxSkew),
			Fix: "run NTP (chrony, systemd-timesyncd) on both hosts; deadlines and overrides follow governord's clock"}
	}
	return finding{Check: "clock", Level: levelOK, Problem: fmt.Sprintf("skew %v", skew.Round(time.Millisecond))}
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// checkTransport checks governord's certificate when TLS is on, and warns
// of plaintext to another host when it is off.
func checkTransport(addrs string, certWarn time.Duration) []finding {
	tlsOn := os.Getenv(governor.EnvCAFile) != "" || os.Getenv(governor.EnvTLS) == "true" || os.Getenv(governor.EnvTLS) == "1"
	if tlsOn {
		var out []finding
		for _, addr := range strings.Split(addrs, ",") {
			out = append(out, checkCert(strings.TrimSpace(addr), os.Getenv(governor.EnvCAFile), certWarn))
		}
		return out
	}
	var out []finding
	for _, addr := range strings.Split(addrs, ",") {
		host, _, err := net.SplitHostPort(strings.TrimSpace(addr))
		if err != nil {
			host = addr
		}
		if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
			continue
		}
		out = append(out, finding{Check: "tls", Level: levelWarn, Subject: addr,
			Problem: "plaintext to another host: API keys and session tokens cross the network in the clear",
			Fix:     "give governord tls.cert_file and tls.key_file, and set GOVERNOR_TLS=true (or GOVERNOR_CA_FILE)"})
	}
	if len(out) == 0 {
		out = append(out, finding{Check: "tls", Level: levelOK, Subject: addrs, Problem: "plaintext on loopback"})
	}
	return out
}

// checkUpstreams dials each pgwire upstream of a sidecar config.
func checkUpstreams(ctx context.Context, p proxyFile) []finding {
	var out []finding
	for _, pg := range p.cfg.PGWire {
		d := net.Dialer{Timeout: 3 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", pg.Upstream)
		if err != nil {
			out = append(out, finding{Check: "pgwire", Level: levelError, Subject: p.path + ": " + pg.Upstream,
				Problem: "the upstream cannot be reached: " + err.Error(),
				Fix:     "start PostgreSQL there, or correct pgwire[].upstream; the sidecar's SQL clients fail until then"})
			continue
		}
		conn.Close()
		out = append(out, finding{Check: "pgwire", Level: levelOK, Subject: p.path + ": " + pg.Upstream, Problem: "reachable"})
	}
	return out
}

// checkCert shakes hands with governord at addr as the SDK would (trusting
// caFile, or the system's roots) and looks at its certificate's expiry.
func checkCert(addr, caFile string, warnWithin time.Duration) finding {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		cfg.ServerName = host
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return finding{Check: "tls", Level: levelError, Subject: caFile, Problem: err.Error(), Fix: "point GOVERNOR_CA_FILE at governord's CA certificate"}
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return finding{Check: "tls", Level: levelError, Subject: caFile, Problem: "holds no PEM certificate", Fix: "point GOVERNOR_CA_FILE at governord's CA certificate"}
		}
	}
	d := &net.Dialer{Timeout: 3 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return finding{Check: "tls", Level: levelError, Subject: addr, Problem: "the TLS handshake failed: " + err.Error(),
			Fix: "check that governord has tls.cert_file for this address and that GOVERNOR_CA_FILE trusts it (or unset GOVERNOR_TLS for a plaintext governord)"}
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return finding{Check: "tls", Level: levelError, Subject: addr, Problem: "governord sent no certificate"}
	}
	left := time.Until(certs[0].NotAfter)
	if left < warnWithin {
		return finding{Check: "tls", Level: levelWarn, Subject: addr,
			Problem: fmt.Sprintf("governord's certificate expires in %v (%s)", left.Round(time.Minute), certs[0].NotAfter.UTC().Format(time.RFC3339)),
			Fix:     "replace tls.cert_file and tls.key_file; governord reloads them without a restart"}
	}
	return finding{Check: "tls", Level: levelOK, Subject: addr, Problem: "certificate valid until " + certs[0].NotAfter.UTC().Format(time.RFC3339)}
}
