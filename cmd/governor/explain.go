package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/classify/sqlclass"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/httpproxy"
	llmmeter "github.com/governor-project/governor/proxy/meter"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// headerFlags collects repeated -H "Name: value" flags.
type headerFlags http.Header

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("%q is not Name: value", v)
	}
	http.Header(h).Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}

const explainUsage = `usage:
  governor explain -config proxy.yaml [-H "Name: value"]... METHOD URL
  governor explain -config proxy.yaml CONNECT host:port
  governor explain -config proxy.yaml /openai/v1/chat/completions   (a base-URL route; method GET unless given)
  governor explain -config proxy.yaml POST http://127.0.0.1:7700/openai/v1/chat/completions   (the same, as the worker calls it)
  governor explain -config proxy.yaml -d @body.json -live payments/pod-7 POST /openai/v1/chat/completions   (a metered call: its estimate)
  governor explain -config proxy.yaml -sql "INSERT INTO payments ..." [-kind insert -tables payments]

flags:
`

func explain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, explainUsage); fs.PrintDefaults() }
	configPath := fs.String("config", "", "governor-proxy's configuration file (required)")
	headers := headerFlags{}
	fs.Var(headers, "H", "a request header, \"Name: value\" (repeatable)")
	sql := fs.String("sql", "", "a SQL statement to classify instead of an HTTP request")
	kinds := fs.String("kind", "", "with -sql: the statement kinds, comma separated (insert, update, ...), instead of what the pgwire parser reads")
	tables := fs.String("tables", "", "with -sql: the tables the statement names, comma separated")
	database := fs.String("database", "", "with -sql: the connection's database")
	user := fs.String("user", "", "with -sql: the connection's user")
	app := fs.String("application-name", "", "with -sql: the connection's application_name")
	live := fs.String("live", "", "a node (path or id, e.g. payments/pod-7/crawl-42): also ask governord how it would answer the request there now, in dry run (GOVERNOR_ADDR, GOVERNOR_API_KEY)")
	data := fs.String("d", "", "the request's body, or @FILE to read it from FILE: a metered rule (meter:) holds an estimate read from it, which -live asks for")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" {
		fmt.Fprintln(stderr, "governor explain: -config is required")
		fs.Usage()
		return 2
	}
	cfg, err := proxyconfig.LoadClassification(*configPath)
	if err != nil {
		fmt.Fprintln(stderr, "governor explain:", err)
		return 2
	}
	if *sql != "" {
		if fs.NArg() > 0 {
			fmt.Fprintln(stderr, "governor explain: -sql takes no METHOD URL arguments")
			return 2
		}
		return explainSQL(stdout, cfg, *sql, classify.SQLStatement{Kinds: split(*kinds), Tables: split(*tables),
			Database: *database, User: *user, ApplicationName: *app})
	}
	req, err := requestFrom(fs.Args(), http.Header(headers))
	if err != nil {
		fmt.Fprintln(stderr, "governor explain:", err)
		fs.Usage()
		return 2
	}
	var body []byte
	if *data != "" {
		if body, err = readData(*data); err != nil {
			fmt.Fprintln(stderr, "governor explain: -d:", err)
			return 2
		}
	}
	code := explainHTTP(stdout, cfg, req, body, *data != "")
	if *live != "" && code == 0 {
		d, ok := cfg.Rules.MatchHTTP(classify.HTTPRequestFrom(req))
		if !ok {
			return code
		}
		ask := asked{charges: d.Charges}
		if d.Meter != nil {
			if *data == "" {
				fmt.Fprintf(stderr, "governor explain: rule %q meters %s: the sidecar asks for an estimate read from the request's body; give it with -d for -live\n",
					d.Rule, d.Meter.Resource)
				return 2
			}
			m := meterFor(d, body)
			if m.refused != nil {
				return 0 // the sidecar refuses it itself, as explainHTTP said; governord is not asked
			}
			if m.est != nil {
				ask = asked{charges: httpproxy.MeteredCharges(d, m.est.Tokens), meter: d.Meter, est: m.est, path: req.URL.Path}
			}
		}
		return explainLive(stdout, stderr, *live, d, ask, classify.WritesHTTP(req.Method, d), d.Shadow || cfg.HTTP.Shadow)
	}
	return code
}

// readData is -d's body: the text itself, or @FILE's contents.
func readData(v string) ([]byte, error) {
	if file, ok := strings.CutPrefix(v, "@"); ok {
		return os.ReadFile(file)
	}
	return []byte(v), nil
}

// meterCall is what the sidecar does with a metered call's body: hold its
// estimate, let it through unmetered (over max_body, oversize: unmetered),
// or refuse it.
type meterCall struct {
	est       *httpproxy.CallEstimate
	unmetered bool
	refused   error
}

func meterFor(d classify.Decision, body []byte) meterCall {
	m := d.Meter
	if int64(len(body)) > m.MaxBody {
		if m.Unmetered {
			return meterCall{unmetered: true}
		}
		return meterCall{refused: fmt.Errorf("the body's %d bytes are over meter.max_body (%d), and meter.oversize is refuse", len(body), m.MaxBody)}
	}
	est, err := httpproxy.EstimateCall(m, body)
	if err != nil {
		return meterCall{refused: err}
	}
	return meterCall{est: &est}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(strings.ToLower(f)); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// requestFrom builds the request as the proxy would receive it.
func requestFrom(args []string, h http.Header) (*http.Request, error) {
	method, target := http.MethodGet, ""
	switch len(args) {
	case 1:
		target = args[0]
	case 2:
		method, target = strings.ToUpper(args[0]), args[1]
	default:
		return nil, fmt.Errorf("want METHOD URL (or a single URL for GET)")
	}
	r := &http.Request{Method: method, Header: h}
	if method == http.MethodConnect {
		if strings.Contains(target, "/") {
			return nil, fmt.Errorf("CONNECT takes host:port, not a URL")
		}
		r.URL, r.Host = &url.URL{Host: target}, target
		return r, nil
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("%q: %v", target, err)
	}
	if !u.IsAbs() && !strings.HasPrefix(u.Path, "/") {
		return nil, fmt.Errorf("%q is neither an absolute URL nor a path under a base-URL route", target)
	}
	if u.IsAbs() && u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: the scheme must be http or https", target)
	}
	r.URL, r.Host = u, u.Host
	return r, nil
}

func explainHTTP(w io.Writer, cfg proxyconfig.Config, r *http.Request, body []byte, hasBody bool) int {
	routed := false
	if r.Method != http.MethodConnect && r.URL.IsAbs() && r.URL.Scheme == "http" && ownAddress(cfg.HTTP.Listen, r.URL) {
		// A worker given a base URL calls the sidecar itself: it sends the
		// path alone, and the sidecar routes it.
		fmt.Fprintf(w, "%s is governor-proxy's own address (http.listen %s): a worker with a base URL sends it the path, which a route forwards\n",
			r.URL.Host, cfg.HTTP.Listen)
		r.URL = &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	}
	if r.Method != http.MethodConnect && !r.URL.IsAbs() {
		routed = true
		u, rt, ok := httpproxy.RouteURL(cfg.Routes, r.URL)
		if !ok {
			fmt.Fprintf(w, "request: %s %s\n\nno base-URL route covers %s; governor-proxy answers 404.\n", r.Method, r.URL, r.URL.Path)
			return 1
		}
		fmt.Fprintf(w, "route: %s -> %s (TLS, if any, originated by the sidecar)\n", rt.Prefix, rt.Upstream)
		r.URL, r.Host = u, u.Host
	}
	q := classify.HTTPRequestFrom(r)
	if r.Method == http.MethodConnect {
		fmt.Fprintf(w, "request: CONNECT %s\n", r.Host)
		if host, _, err := net.SplitHostPort(r.Host); err == nil && cfg.HTTP.Intercept.Hosts.Match(host) {
			fmt.Fprintf(w, "  %s is intercepted (http.intercept): the tunnel itself is not governed; each request inside it is decided as a plain https:// request (explain one with its URL)\n", host)
			return 0
		}
		fmt.Fprintln(w, "  a tunnel shows only host and port: rules with scheme, method, path or header never match it")
	} else {
		fmt.Fprintf(w, "request: %s %s\n", r.Method, r.URL)
	}
	rules := cfg.Rules
	steps := rules.ExplainHTTP(q)
	fmt.Fprintf(w, "\nrules (%d; the first match wins):\n", rules.Len())
	for i, s := range steps {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
	d, ok := rules.MatchHTTP(q)
	fmt.Fprintln(w)
	if !ok {
		if cfg.HTTP.Unmatched == proxyconfig.UnmatchedDeny {
			fmt.Fprintln(w, "decision: no rule matches; http.unmatched is deny, so the proxy answers 403 (Governor-Denied: unmatched)")
		} else {
			fmt.Fprintln(w, "decision: no rule matches; http.unmatched is forward, so the proxy forwards it ungoverned (counted under rule \"(unmatched)\")")
		}
		return 0
	}
	fmt.Fprintf(w, "decision: %s\n", d)
	describe(w, d, r.Method == http.MethodConnect, cfg)
	if d.Meter != nil && r.Method != http.MethodConnect {
		describeMeter(w, d, body, hasBody)
	}
	if r.URL.Scheme == "https" && !routed {
		tunnelNote(w, cfg, r.URL)
	}
	return 0
}

// ownAddress reports whether u is an address of the proxy listening on
// listen: the same port, and the same host or, for a proxy on loopback or
// on every address, a loopback one (127.0.0.1, ::1, localhost).
func ownAddress(listen string, u *url.URL) bool {
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	if port != lport {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, lhost) {
		return true
	}
	loopback := func(h string) bool {
		ip := net.ParseIP(h)
		return strings.EqualFold(h, "localhost") || ip != nil && ip.IsLoopback()
	}
	unspecified := lhost == "" || net.ParseIP(lhost) != nil && net.ParseIP(lhost).IsUnspecified()
	return loopback(host) && (loopback(lhost) || unspecified)
}

// tunnelNote says what happens to the same https URL sent through
// HTTPS_PROXY: it arrives as a CONNECT tunnel, matched on host and port only.
func tunnelNote(w io.Writer, cfg proxyconfig.Config, u *url.URL) {
	host := u.Host
	if u.Port() == "" {
		host += ":443"
	}
	if cfg.HTTP.Intercept.Hosts.Match(u.Hostname()) {
		fmt.Fprintf(w, "\nnote: %s is intercepted (http.intercept): a worker that sends this through HTTPS_PROXY gets it decided as above, request by request, inside its tunnel\n", u.Hostname())
		return
	}
	q := classify.HTTPRequestFrom(&http.Request{Method: http.MethodConnect, URL: &url.URL{Host: host}, Host: host})
	fmt.Fprintf(w, "\nnote: a worker that sends this through HTTPS_PROXY opens a tunnel, CONNECT %s, and only host and port are seen:\n", host)
	if d, ok := cfg.Rules.MatchHTTP(q); ok {
		fmt.Fprintf(w, "  the tunnel matches rule %q (class %q) instead; method and path rules need plain HTTP or a base-URL route\n", d.Rule, d.Class)
	} else if cfg.HTTP.Unmatched == proxyconfig.UnmatchedDeny {
		fmt.Fprintln(w, "  no rule matches the tunnel, and http.unmatched is deny: it is refused (403)")
	} else {
		fmt.Fprintln(w, "  no rule matches the tunnel, and http.unmatched is forward: it goes through ungoverned; use a base-URL route to govern it by path")
	}
}

// describe says in words what the proxy does with a decision.
func describe(w io.Writer, d classify.Decision, tunnel bool, cfg proxyconfig.Config) {
	holds := "until the response body ends or the client goes away"
	if tunnel {
		holds = "until the tunnel's connection closes"
	}
	charges := chargeList(d.Charges)
	switch {
	case d.Class == "" && len(d.Charges) == 0 && d.Bytes != nil:
		fmt.Fprintln(w, "  before forwarding: no lease and no charge per request")
	case d.Class == "" && len(d.Charges) == 0:
		fmt.Fprintln(w, "  forwarded without asking governord: the rule takes no lease and charges nothing")
	case d.Class == "":
		fmt.Fprintf(w, "  before forwarding: charge %s (no lease). A spent quota answers 429 (Governor-Denied: quota).\n", charges)
	case len(d.Charges) == 0:
		fmt.Fprintf(w, "  before forwarding: take a lease of class %s, waiting up to %v while the limit is full; held %s\n", d.Class, cfg.HTTP.WaitTimeout, holds)
	default:
		fmt.Fprintf(w, "  before forwarding, in one call: charge %s and take a lease of class %s (waiting up to %v while the limit is full); held %s\n",
			charges, d.Class, cfg.HTTP.WaitTimeout, holds)
	}
	describeBytes(w, d, tunnel)
	if hc := d.ChargeFromHeader; hc != nil {
		if tunnel {
			fmt.Fprintf(w, "  charge_from_header (%s from %s) never applies to a tunnel: the proxy cannot see its responses\n", hc.Resource, hc.Header)
		} else {
			fmt.Fprintf(w, "  after the response: charge %s by the number in the response header %s\n", hc.Resource, hc.Header)
		}
	}
	fmt.Fprintln(w, "  charged to the subtask named by Proxy-Authorization's username, or to the task without one")
	if d.Shadow || cfg.HTTP.Shadow {
		fmt.Fprintln(w, "  mode: shadow: governord is asked in dry run and the request is always forwarded; nothing is charged or held, and a would-be denial is logged and counted (governor_proxy_shadow_denials_total)")
	}
}

// describeMeter says what a metered rule holds for this body before it
// forwards the call, as the sidecar works it out.
func describeMeter(w io.Writer, d classify.Decision, body []byte, hasBody bool) {
	m := d.Meter
	if !hasBody {
		fmt.Fprintf(w, "  meter (%s): before forwarding, holds an estimate of %s read from the request's body (give it with -d to see it); settled to the usage the response reports\n",
			m.API, m.Resource)
		return
	}
	switch c := meterFor(d, body); {
	case c.unmetered:
		fmt.Fprintf(w, "  meter (%s): the body's %d bytes are over max_body (%d) and oversize is unmetered: forwarded unmetered, nothing held\n", m.API, len(body), m.MaxBody)
	case c.refused != nil:
		fmt.Fprintf(w, "  meter (%s): the sidecar refuses this body (400, Governor-Denied: bad-request): %v\n", m.API, c.refused)
	default:
		fmt.Fprintf(w, "  meter (%s): before forwarding, holds an estimate of %d %s (input %d, from the body's %d bytes; output %d); settled to the usage the response reports\n",
			m.API, c.est.Tokens, m.Resource, c.est.Input, len(body), c.est.Tokens-c.est.Input)
	}
}

// asked is what the sidecar asks governord for a request: the rule's
// charges, and for a metered call the estimate it holds.
type asked struct {
	charges map[string]int64
	meter   *classify.Meter
	est     *httpproxy.CallEstimate
	path    string // the upstream's path, which names the API's output limit
}

// explainLive asks governord how it would answer the decision's request on
// node now, asking for what the sidecar would (DryRun: nothing is charged
// or held), and says so; for a rule in shadow, counting the shadow ledger,
// as the rule's next request would be.
func explainLive(w, stderr io.Writer, node string, d classify.Decision, ask asked, write, shadow bool) int {
	ctx := context.Background()
	c, err := connect(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "governor explain:", err)
		return 1
	}
	defer c.Close()
	n, err := resolve(ctx, c.Raw(), node)
	if err != nil {
		fmt.Fprintln(stderr, "governor explain:", err)
		return 1
	}
	resp, err := c.Raw().DryRun(ctx, &governorpb.DryRunRequest{NodeId: n.GetId(), Class: d.Class, Charges: ask.charges, Write: write, Shadow: shadow})
	if err != nil {
		fmt.Fprintln(stderr, "governor explain:", plainStatus(err))
		return 1
	}
	how := "a dry run: nothing charged or held"
	if shadow {
		how = "the rule is in shadow: a dry run counting the shadow ledger, what the rule's requests so far would have charged, with nothing charged, held or recorded"
	}
	fmt.Fprintf(w, "\nlive, on %s (id %d), as governord would answer now (%s):\n", node, n.GetId(), how)
	if len(ask.charges) > 0 {
		note := ""
		if ask.est != nil {
			note = fmt.Sprintf(" (%s: the meter's estimate)", ask.meter.Resource)
		}
		fmt.Fprintf(w, "  asked for: %s%s\n", chargeList(ask.charges), note)
	}
	switch resp.GetOutcome() {
	case "admitted":
		fmt.Fprintln(w, "  admitted")
	case "wait":
		fmt.Fprintln(w, "  it would wait for a lease: a limit on the chain is full now")
	default:
		fmt.Fprintf(w, "  refused (%s): %s\n", resp.GetOutcome(), resp.GetMessage())
		if fit := estimateFit(ask, resp.GetDenial()); fit != nil {
			fmt.Fprintf(w, "  the sidecar answers 429: %s\n", fit.Message())
			if ask.meter.Clamp && fit.Estimate.MaxOutput() > 0 {
				fmt.Fprintf(w, "  (on_over_estimate: clamp: the sidecar lowers %s to %d and forwards it instead)\n", fit.Estimate.Field, fit.Estimate.MaxOutput())
			}
		}
	}
	return 0
}

// estimateFit is the sidecar's refusal of a metered call whose estimate,
// not the budget, is what does not fit (the quota has room left), as it
// words it; nil otherwise.
func estimateFit(ask asked, den *governorpb.Denial) *admission.Denial {
	if ask.est == nil || den == nil || den.GetResource() != ask.meter.Resource || den.GetLimit()-den.GetUsed() <= 0 {
		return nil
	}
	api, err := llmmeter.ParseAPI(ask.meter.API)
	if err != nil {
		return nil
	}
	return &admission.Denial{Cause: admission.CauseQuota,
		Quota: &governor.Denial{Resource: den.GetResource(), NodeID: den.GetNodeId(), NodeName: den.GetNodeName(), Used: den.GetUsed(),
			Limit: den.GetLimit(), Amount: den.GetAmount()},
		Estimate: &admission.EstimateFit{Estimate: ask.est.Tokens, Input: ask.est.Input, Left: den.GetLimit() - den.GetUsed(),
			Field: llmmeter.OutputField(api, ask.path, ask.est.Request)}}
}

func chargeList(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func explainSQL(w io.Writer, cfg proxyconfig.Config, stmt string, given classify.SQLStatement) int {
	fmt.Fprintf(w, "statement: %s\n", stmt)
	if len(given.Kinds) > 0 {
		explainStatement(w, cfg, "as given by hand", given)
		return 0
	}
	// The same classifier the pgwire listeners use; each statement of the
	// text is matched, and charged, on its own.
	c := sqlclass.Classify(stmt)
	for i, s := range c.Statements {
		how := "as the pgwire parser reads it"
		if len(c.Statements) > 1 {
			how = fmt.Sprintf("statement %d of %d, %s", i+1, len(c.Statements), how)
		}
		if s.Count > 1 {
			how += fmt.Sprintf(" (%d of them in a row, each matched and charged)", s.Count)
		}
		if s.Execute != "" {
			// What a name is prepared as lives on one connection.
			how += fmt.Sprintf("; it runs the statement prepared as %q, which the proxy follows per connection; here that is unknown", s.Execute)
			s = s.Executing(nil)
		}
		st := given
		st.Kinds, st.Tables = s.Kinds, s.Tables
		explainStatement(w, cfg, how, st)
	}
	return 0
}

func explainStatement(w io.Writer, cfg proxyconfig.Config, how string, st classify.SQLStatement) {
	fmt.Fprintf(w, "\n%s: kinds %v, tables %v, database %q, user %q, application_name %q\n",
		how, st.Kinds, st.Tables, st.Database, st.User, st.ApplicationName)
	rules := cfg.Rules
	fmt.Fprintf(w, "\nrules (%d; the first match wins):\n", rules.Len())
	for i, s := range rules.ExplainSQL(st) {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
	d, ok := rules.MatchSQL(st)
	fmt.Fprintln(w)
	if !ok {
		fmt.Fprintln(w, "decision: no rule matches")
		return
	}
	fmt.Fprintf(w, "decision: %s\n", d)
	switch {
	case d.Class == "" && len(d.Charges) == 0 && d.Result != nil:
		fmt.Fprintln(w, "  before it runs: hold 1 of each result resource (refused with 53400 while a quota of them is spent)")
	case d.Class == "" && len(d.Charges) == 0:
		fmt.Fprintln(w, "  run without asking governord")
	case d.Class == "":
		fmt.Fprintf(w, "  before it runs: charge %s\n", chargeList(d.Charges))
	default:
		fmt.Fprintf(w, "  before it runs: charge %s, and hold a lease of class %s until the transaction ends (taken at the first statement that needs it)\n", orNone(chargeList(d.Charges)), d.Class)
	}
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// describeBytes says how a bytes rule charges what the request carries.
func describeBytes(w io.Writer, d classify.Decision, tunnel bool) {
	b := d.Bytes
	if b == nil {
		return
	}
	if tunnel {
		fmt.Fprintf(w, "  the tunnel's bytes are charged to %s as they pass (a chunk of up to %d at a time; a rate slows the copy, a spent quota cuts the tunnel)\n", b.Resource, b.Chunk)
		return
	}
	if b.Request {
		fmt.Fprintf(w, "  the request body is charged to %s: a known Content-Length whole, with the admission (a quota too small refuses it, 429); any other as it streams\n", b.Resource)
	}
	if b.Response {
		fmt.Fprintf(w, "  the response body is charged to %s: a known Content-Length whole before it is passed on; any other as it streams, cut where the quota ends\n", b.Resource)
	}
}
