package compat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// enableEnv turns the matrix on; scripts/compat.sh sets it once the
	// clients are installed.
	enableEnv = "GOVERNOR_COMPAT"
	// writeEnv has the run write docs/compatibility.md instead of comparing
	// its results with it.
	writeEnv = "GOVERNOR_COMPAT_WRITE"
	docFile  = "../docs/compatibility.md"
	// waitFor bounds every wait for a client or a condition.
	waitFor = 60 * time.Second
)

// A result is one cell of the matrix as a client script reports it: result
// is ok, fail, unsupported (the client has no such feature), skip (the cell
// does not apply, e.g. a denial on a direct connection) or, for a denial
// only, error (the client raised an error that names the status rather
// than return the response).
type result struct {
	Cell   string `json:"cell"`
	Result string `json:"result"`
	Detail string `json:"detail"`
}

// A row is one client's results.
type row struct {
	client  string
	version string
	cells   map[string]result
	direct  map[string]result // the same script directly, for the drivers
}

// A table is one matrix: its columns and, once run, its rows.
type table struct {
	title, intro string
	columns      []string
	clients      []string // every row the table must have for the doc
	mu           sync.Mutex
	rows         map[string]*row
}

func (tb *table) record(r *row) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.rows == nil {
		tb.rows = map[string]*row{}
	}
	tb.rows[r.client] = r
}

func (tb *table) complete() bool {
	for _, c := range tb.clients {
		if tb.rows[c] == nil {
			return false
		}
	}
	return true
}

// word is what a cell shows in the table.
func word(r result, ok bool) string {
	switch {
	case !ok:
		return "—"
	case r.Result == "ok":
		return "yes"
	case r.Result == "skip":
		return "n/a"
	case r.Result == "unsupported":
		return "no"
	case r.Result == "error":
		return "error"
	}
	return "**FAIL**"
}

func (tb *table) markdown(w *bytes.Buffer) {
	fmt.Fprintf(w, "## %s\n\n%s\n\n", tb.title, tb.intro)
	fmt.Fprintf(w, "| client | %s |\n|---|%s\n", strings.Join(tb.columns, " | "), strings.Repeat("---|", len(tb.columns)))
	for _, c := range tb.clients {
		r := tb.rows[c]
		var cells []string
		for _, col := range tb.columns {
			res, ok := r.cells[col]
			cells = append(cells, word(res, ok))
		}
		fmt.Fprintf(w, "| %s | %s |\n", c, strings.Join(cells, " | "))
	}
	w.WriteString("\nWhat each cell saw:\n\n")
	for _, c := range tb.clients {
		r := tb.rows[c]
		// Cells that saw the same are named together.
		var notes []string
		cols := map[string][]string{}
		for _, col := range tb.columns {
			res := r.cells[col]
			note := res.Detail
			if d, ok := r.direct[col]; ok && d.Detail != res.Detail && d.Result != "skip" {
				note += fmt.Sprintf(" (directly: %s)", d.Detail)
			}
			if note == "" {
				continue
			}
			if cols[note] == nil {
				notes = append(notes, note)
			}
			cols[note] = append(cols[note], col)
		}
		if len(notes) == 0 {
			continue
		}
		fmt.Fprintf(w, "- **%s**\n", c)
		for _, note := range notes {
			fmt.Fprintf(w, "  - %s: %s\n", strings.Join(cols[note], ", "), note)
		}
	}
	w.WriteString("\n")
}

var (
	drivers = &table{
		title: "PostgreSQL drivers through pgwire",
		intro: "Each driver ran its script twice in the same run: directly against PostgreSQL and through governor-proxy's " +
			"pgwire listener, whose rules give every statement a `db` slot and charge an `INSERT` into `compat_denied` to a " +
			"quota of 0. A cell passes only if it passed both ways (the denial applies only through the proxy). The user " +
			"`gov_scram` logs in with SCRAM-SHA-256. *simple*: a query of two statements (the simple protocol); *prepared*: a " +
			"query with parameters, through a named statement where the driver makes one; *transactions*: one committed, " +
			"one rolled back; *denial*: a denied `INSERT` inside a transaction (SQLSTATE 53400), then `COMMIT`, which must " +
			"commit nothing, and the connection goes on; *copy*: `COPY FROM STDIN` and `TO STDOUT`; *listen*: `LISTEN`, " +
			"and a `NOTIFY` from another connection; *cancel*: a cancel request ends a running `pg_sleep` (57014) and the " +
			"connection goes on; *disconnect*: `pg_terminate_backend` from another connection, then a new connection. " +
			"pgx is not a row here: its own whole test suite runs through the proxy (`scripts/pgxsuite.sh`).",
		columns: []string{"connect", "simple", "prepared", "transactions", "denial", "copy", "listen", "cancel", "disconnect"},
		clients: []string{"psycopg2", "psycopg 3", "node-postgres Client", "node-postgres Pool", "PostgreSQL JDBC", "lib/pq"},
	}
	httpClients = &table{
		title: "HTTP clients through the forward proxy",
		intro: "Each client is pointed at governor-proxy the way it reads a proxy in production (noted per client), and " +
			"asks for origins named `origin.test`, which only the proxy resolves. *http*: a plain GET; *https*: a GET " +
			"through a CONNECT tunnel, trusting the test origin's certificate; *chunked upload*: a 1 MiB POST of unknown " +
			"length (Transfer-Encoding: chunked), which the origin must receive whole; *sse*: a `text/event-stream` " +
			"response whose second event is sent only after the client, having read the first, asks for it, so a " +
			"buffering proxy deadlocks it; *429* and *503*: a quota denial (`x-should-retry: false`, no `Retry-After`) and " +
			"a wait-timeout denial (`Retry-After`) of plain requests, each asked for once: the client must see the status and " +
			"`Governor-Denied`; *429 on CONNECT*: an `https://` URL whose tunnel the proxy denies for quota, as LLM APIs " +
			"over HTTPS are, where the status line carries the reason; *no retry*: the proxy counted exactly one request " +
			"for each of the three denials.",
		columns: []string{"http", "https", "chunked upload", "sse", "429", "503", "429 on CONNECT", "no retry"},
		clients: []string{"curl, HTTP_PROXY/HTTPS_PROXY", "curl -x", "Python requests", "Python urllib",
			"Node fetch (undici EnvHttpProxyAgent)", "Node fetch (undici EnvHttpProxyAgent, proxyTunnel: false)",
			"Node built-in fetch, no setting", "axios", "Java HttpClient",
			"Go net/http"},
	}
	intercepted = &table{
		title: "HTTPS clients through interception",
		intro: "governor-proxy intercepts every host below `intercept.test` (`http.intercept`) with a CA of its own, in front " +
			"of one HTTPS origin. Each client is pointed at the proxy as in production, trusts the CA the way it does in " +
			"production (noted per client), and sends six GETs with one client object to a host of its own, whose rule " +
			"charges each request to a quota of 5. *handshake*: the client's TLS handshake with the sidecar's certificate " +
			"completed, or, for the client given no CA, failed on the client's side, with the sidecar counting " +
			"`client_refused_certificate` and nothing reaching the origin; *5 reach the origin*: the origin served exactly " +
			"5; *6th: 429 quota*: the client got 200 five times, then `429` with `Governor-Denied: quota` as a response " +
			"inside TLS; *keep-alive*: the client reused its TLS connection (the sidecar counted fewer handshakes than " +
			"requests; *no*: a connection for each request, each still charged); *no retry*: the sidecar refused exactly " +
			"one request. axios's CONNECT agent keeps no connection, and undici opens a second one while it releases the " +
			"first; each does the same through a tunnel that is not intercepted.",
		columns: []string{cellHandshake, cellServed, cellDenied, cellKeepAlive, cellNoRetry},
		clients: []string{"curl --cacert --http1.1", "curl --cacert --http2", "Python requests", "Node fetch (undici EnvHttpProxyAgent)",
			"axios", "Java HttpClient", "Go net/http", "curl without the CA (must refuse)",
			"Node fetch (undici) without the CA (must refuse)"},
	}
	tables = []*table{drivers, httpClients, intercepted}
)

// enabled skips t unless the matrix is on.
func enabled(t *testing.T) {
	t.Helper()
	if os.Getenv(enableEnv) == "" {
		t.Skipf("%s is not set: scripts/compat.sh installs the clients and runs the matrix", enableEnv)
	}
}

// runScript runs a client script and reads the results it prints, one JSON
// object per line. Lines that are not JSON are kept for the failure's
// message.
func runScript(t *testing.T, env []string, name string, args ...string) (version string, cells map[string]result) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(cleanEnv(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	timer := time.AfterFunc(3*waitFor, func() { cmd.Process.Kill() })
	defer timer.Stop()
	cells = map[string]result{}
	var other []string
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Cell == "" {
			other = append(other, sc.Text())
			continue
		}
		if r.Cell == "version" {
			version = r.Detail
			continue
		}
		cells[r.Cell] = r
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("%s %v: %v\nstdout:\n%s\nstderr:\n%s", name, args, err, strings.Join(other, "\n"), stderr.String())
	}
	return version, cells
}

// cleanEnv is the environment without any proxy setting or libpq variable
// of the machine's, so that each client sees only what its cell gives it.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.EqualFold(k, "http_proxy"), strings.EqualFold(k, "https_proxy"), strings.EqualFold(k, "all_proxy"),
			strings.EqualFold(k, "no_proxy"), strings.HasPrefix(k, "PG"), strings.HasPrefix(k, "NODE_"),
			k == "JAVA_TOOL_OPTIONS", k == "SSL_CERT_FILE", k == "REQUESTS_CA_BUNDLE", k == "CURL_CA_BUNDLE":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// render is the whole doc: the tables, compared with the checked-in file,
// then the versions they were measured with, which are not (a machine may
// have another patch release of a Debian package).
func render() []byte {
	var w bytes.Buffer
	w.WriteString("# Client compatibility\n\n")
	w.WriteString("Generated by the compatibility matrix (`compat/`, run by `scripts/compat.sh`, which `./test.sh` runs); " +
		"`GOVERNOR_COMPAT_WRITE=1 scripts/compat.sh` rewrites it, and a run whose results differ from it fails. " +
		"*yes*: works as it does without the proxy; *no*: the client has no such feature; *n/a*: does not apply; " +
		"*error*: the client raised an error naming the status instead of returning the response; *—*: not run. Clients that need a setting are listed in the README (\"Clients that need a setting\").\n\n")
	for _, tb := range tables {
		tb.markdown(&w)
	}
	w.WriteString(versionsHeading + "\n\n")
	for _, tb := range tables {
		for _, c := range tb.clients {
			if v := tb.rows[c].version; v != "" {
				fmt.Fprintf(&w, "- %s: %s\n", c, v)
			}
		}
	}
	return w.Bytes()
}

const versionsHeading = "## Measured with"

// compared is the part of the doc a run must reproduce.
func compared(doc []byte) string {
	before, _, _ := strings.Cut(string(doc), versionsHeading)
	return before
}

func TestMain(m *testing.M) {
	switch os.Getenv(goClientEnv) {
	case "":
	case goInterceptMode:
		os.Exit(goInterceptMain()) // the Go client of TestInterceptedHTTPS
	default:
		os.Exit(goClientMain()) // the Go client of TestHTTPClients
	}
	flag.Parse()
	code := m.Run()
	write := os.Getenv(writeEnv) != ""
	// A failed run is compared with nothing, but written when asked: the
	// doc then shows what failed, and the run still fails.
	if (code != 0 && !write) || os.Getenv(enableEnv) == "" {
		os.Exit(code)
	}
	for _, tb := range tables {
		if !tb.complete() {
			fmt.Fprintf(os.Stderr, "compat: %s has rows missing (a -run filter, or a test that stopped); %s not checked\n", tb.title, docFile)
			os.Exit(code)
		}
	}
	doc := render()
	if write {
		if err := os.WriteFile(docFile, doc, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "compat:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "compat: wrote %s\n", filepath.Clean(docFile))
		if code != 0 {
			fmt.Fprintf(os.Stderr, "compat: with this run's failures, shown as **FAIL**\n")
		}
		os.Exit(code)
	}
	old, err := os.ReadFile(docFile)
	if err != nil || compared(old) != compared(doc) {
		// The lines that differ come last: a log shown by its tail shows them.
		fmt.Fprintf(os.Stderr, "compat: this run's results:\n%s\n", doc)
		fmt.Fprintf(os.Stderr, "compat: the matrix differs from %s (%v):\n%s"+
			"Rerun with %s=1 to rewrite it once the change is understood.\n",
			docFile, err, lineDiff(compared(old), compared(doc)), writeEnv)
		os.Exit(1)
	}
	os.Exit(0)
}

// must reports a cell that failed.
func checkCells(t *testing.T, client string, cols []string, cells map[string]result) {
	t.Helper()
	for _, col := range cols {
		r, ok := cells[col]
		switch {
		case !ok:
			t.Errorf("%s: no result for %s", client, col)
		case r.Result == "error" && (col == "429" || col == "503" || col == cellTunnel):
		case !slices.Contains([]string{"ok", "skip", "unsupported"}, r.Result):
			t.Errorf("%s: %s: %s %s", client, col, r.Result, r.Detail)
		}
	}
}

// lineDiff lists the lines only in want ("-") and only in got ("+"), in
// order: enough to see which cell changed without a diff tool.
func lineDiff(want, got string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	inWant, inGot := count(want), count(got)
	var b strings.Builder
	for _, side := range []struct {
		mark       string
		text       string
		own, other map[string]int
	}{{"-", want, inWant, inGot}, {"+", got, inGot, inWant}} {
		for _, l := range strings.Split(side.text, "\n") {
			if side.own[l] > side.other[l] {
				side.own[l]--
				fmt.Fprintf(&b, "%s %s\n", side.mark, l)
			}
		}
	}
	return b.String()
}
