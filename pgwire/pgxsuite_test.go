package pgwire_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/pgwire"
)

// notThroughAProxy lists the pgx tests that pass against PostgreSQL but
// cannot pass through a proxy by their nature, by package and test name,
// with the reason. TestPgxSuite fails on any other test that passes directly
// and not through the proxy, and on an entry here that passes through it.
var notThroughAProxy = map[string]string{
	"pgconn TestConnect/Unix_socket":            unixSocket,
	"pgconn TestConnectWithOptions/Unix_socket": unixSocket,
	"pgconn TestConnectTLS/WithChannelBinding": "SCRAM-SHA-256-PLUS binds the login to the server's TLS " +
		"certificate; a proxy that terminates TLS is what channel binding exists to detect, so the proxy hides -PLUS " +
		"and channel_binding=require fails",
	"pgconn TestConnectTLSPasswordProtectedClientCertWithSSLPassword":                clientCert,
	"pgconn TestConnectTLSPasswordProtectedClientCertWithGetSSLPasswordConfigOption": clientCert,
}

const (
	unixSocket = "governor-proxy listens on TCP only; the test's connection string names PostgreSQL's unix socket"
	clientCert = "certificate authentication (pg_hba's cert): the proxy terminates the client's TLS, so the " +
		"server never sees the client's certificate"
)

// TestPgxSuite runs pgx's own test suite directly against PostgreSQL and
// through pgwire proxies (ungoverned, then governed by `sql: any`), and
// fails when a test passes directly but not through a proxy. It needs a
// server set up as pgx's CI sets one up: scripts/pgxsuite.sh does that and
// runs it.
func TestPgxSuite(t *testing.T) {
	pkgs := strings.Fields(os.Getenv("GOVERNOR_PGX_SUITE"))
	if len(pkgs) == 0 {
		t.Skip("GOVERNOR_PGX_SUITE is unset: scripts/pgxsuite.sh runs pgx's suite through the proxy")
	}
	port := pgPort(t)
	certs := os.Getenv("GOVERNOR_PGX_CERTS")
	socketDir := os.Getenv("GOVERNOR_TEST_PG_DIR")
	serverTLS, upstreamTLS := pgxTLS(t, certs)

	direct := pgxTarget{tcp: "127.0.0.1:" + port, tls: "localhost:" + port, unix: socketDir}
	start := time.Now()
	want := runPgxSuite(t, "direct", pkgs, direct.env(certs))
	t.Logf("direct: %s in %v", want.summary(), time.Since(start).Round(time.Second))
	for _, k := range want.not("pass") {
		t.Logf("direct: %s: %s (not compared)", k, want.outcome[k])
	}

	// Through the proxy: plain upstream for the plain and password logins
	// (the client's TLS terminated at the proxy), TLS upstream for pgx_ssl,
	// whose pg_hba line is hostssl. No unix socket: governor-proxy listens
	// on TCP only.
	ungoverned := pgxTarget{
		tcp: startProxy(t, &pgwire.Proxy{TLSConfig: serverTLS}),
		tls: "localhost:" + portOf(startProxy(t, &pgwire.Proxy{TLSConfig: serverTLS, UpstreamTLS: upstreamTLS})),
	}
	failed := false
	compare := func(name string, target pgxTarget) {
		start := time.Now()
		env := target.env(certs)
		got := runPgxSuite(t, name, pkgs, env)
		t.Logf("%s: %s in %v", name, got.summary(), time.Since(start).Round(time.Second))
		if !comparePgx(t, name, want, got, env) {
			failed = true
		}
	}
	compare("through the proxy", ungoverned)

	srv := governord(t, 1000)
	governedTLS := func(up *tls.Config) func(*pgwire.Proxy) {
		return func(p *pgwire.Proxy) { p.TLSConfig, p.UpstreamTLS, p.WaitTimeout = serverTLS, up, 30*time.Second }
	}
	governed := pgxTarget{
		tcp: governedProxy(t, srv, governor.Spec{Name: "pgx-suite"}, governedTLS(nil)),
		tls: "localhost:" + portOf(governedProxy(t, srv, governor.Spec{Name: "pgx-suite-tls"}, governedTLS(upstreamTLS))),
	}
	compare("governed (sql: any)", governed)
	if failed {
		t.Fail()
	}
}

// pgxTLS loads pgx's test certificates: the server's, for the proxy to
// present to clients that verify localhost against pgx's CA, and the CA, for
// the proxy's own TLS to the server.
func pgxTLS(t *testing.T, dir string) (server, upstream *tls.Config) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "localhost.crt"), filepath.Join(dir, "localhost.key"))
	if err != nil {
		t.Fatalf("pgx's certificates (GOVERNOR_PGX_CERTS): %v", err)
	}
	pem, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return &tls.Config{Certificates: []tls.Certificate{cert}}, &tls.Config{RootCAs: roots, ServerName: "localhost"}
}

func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// pgxTarget is where pgx's tests connect: host:port for TCP logins, and for
// TLS ones (whose host must be localhost, the certificate's name), and the
// unix socket's folder ("" for none).
type pgxTarget struct{ tcp, tls, unix string }

// env is pgx's PGX_TEST_* set for the target, as pgx's own
// scripts/lib/test_targets.rb builds it.
func (x pgxTarget) env(certs string) []string {
	hp := func(addr string) string {
		i := strings.LastIndexByte(addr, ':')
		return fmt.Sprintf("host=%s port=%s", addr[:i], addr[i+1:])
	}
	ca := filepath.Join(certs, "ca.pem")
	env := []string{
		"PGX_TEST_DATABASE=" + hp(x.tcp) + " user=pgx_md5 password=secret dbname=pgx_test",
		"PGX_TEST_TCP_CONN_STRING=" + hp(x.tcp) + " user=pgx_md5 password=secret dbname=pgx_test",
		"PGX_TEST_MD5_PASSWORD_CONN_STRING=" + hp(x.tcp) + " user=pgx_md5 password=secret dbname=pgx_test",
		"PGX_TEST_PLAIN_PASSWORD_CONN_STRING=" + hp(x.tcp) + " user=pgx_pw password=secret dbname=pgx_test",
		"PGX_TEST_SCRAM_PASSWORD_CONN_STRING=" + hp(x.tcp) + " user=pgx_scram password=secret dbname=pgx_test channel_binding=disable",
		"PGX_TEST_SCRAM_PLUS_CONN_STRING=" + hp(x.tls) + " user=pgx_ssl password=secret sslmode=verify-full sslrootcert=" + ca +
			" dbname=pgx_test channel_binding=require",
		"PGX_TEST_TLS_CONN_STRING=" + hp(x.tls) + " user=pgx_ssl password=secret sslmode=verify-full sslrootcert=" + ca +
			" dbname=pgx_test channel_binding=disable",
		"PGX_TEST_TLS_CLIENT_CONN_STRING=" + hp(x.tls) + " user=pgx_sslcert sslmode=verify-full sslrootcert=" + ca +
			" sslcert=" + filepath.Join(certs, "pgx_sslcert.crt") + " sslkey=" + filepath.Join(certs, "pgx_sslcert.key") + " dbname=pgx_test",
		"PGX_SSL_PASSWORD=certpw",
	}
	if x.unix != "" {
		env = append(env, fmt.Sprintf("PGX_TEST_UNIX_SOCKET_CONN_STRING=host=%s port=%s dbname=pgx_test", x.unix, portOf(x.tcp)))
	}
	return env
}

// pgxResults are the outcomes of one run: "pass", "fail" or "skip" by
// "package test" (the package without pgx's module path), and the output of
// each test that did not pass.
type pgxResults struct {
	outcome map[string]string
	output  map[string]*bytes.Buffer
}

// not lists the tests whose outcome is not o, in order.
func (r pgxResults) not(o string) []string {
	var keys []string
	for k, got := range r.outcome {
		if got != o && !strings.HasSuffix(k, " ") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func (r pgxResults) summary() string {
	n := map[string]int{}
	for k, o := range r.outcome {
		if !strings.HasSuffix(k, " ") {
			n[o]++
		}
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", n["pass"], n["fail"], n["skip"])
}

// tempName matches what a temporary folder adds to a test's name (say
// TestParseConfigSSLCertMode/servicefile='/tmp/TestParseConfigSSLCertMode4147384202/001/...'),
// which differs from run to run.
var tempName = regexp.MustCompile(`[0-9]{6,}`)

// pgxKey is a test's key in pgxResults: its package without pgx's module
// path ("pgx" for the root) and its name; "package " for the package's own
// line.
func pgxKey(pkg, test string) string {
	p := strings.TrimPrefix(strings.TrimPrefix(pkg, "github.com/jackc/pgx/v5"), "/")
	if p == "" {
		p = "pgx"
	}
	return p + " " + tempName.ReplaceAllString(test, "#")
}

// runPgxSuite runs go test on pgx's packages with env, and returns each
// test's outcome.
func runPgxSuite(t *testing.T, name string, pkgs []string, env []string) pgxResults {
	t.Helper()
	return runPgx(t, name, env, pkgs...)
}

// runPgx runs go test with env and args (packages, flags), and returns each
// test's outcome.
func runPgx(t *testing.T, name string, env []string, args ...string) pgxResults {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, append([]string{"test", "-json", "-count=1", "-timeout=15m"}, args...)...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PGX_") || strings.HasPrefix(kv, "PG")
	}), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	res := pgxResults{outcome: map[string]string{}, output: map[string]*bytes.Buffer{}}
	dec := json.NewDecoder(bufio.NewReader(out))
	for {
		var ev struct{ Action, Package, Test, Output string }
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: go test -json: %v", name, err)
		}
		key := pgxKey(ev.Package, ev.Test)
		switch ev.Action {
		case "pass", "fail", "skip":
			res.outcome[key] = ev.Action
		case "output":
			b := res.output[key]
			if b == nil {
				b = new(bytes.Buffer)
				res.output[key] = b
			}
			if b.Len() < 8<<10 {
				b.WriteString(ev.Output)
			}
		}
	}
	// go test exits 1 when a test fails: the outcomes say which.
	if err := cmd.Wait(); err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("%s: go test: %v", name, err)
		}
	}
	return res
}

// comparePgx reports every test that passed in want but not in got, and
// every entry of notThroughAProxy that did pass or does not exist; it
// returns false if any is not excused. A test that failed through the
// proxy is run again, alone, once: one that passes then is reported as
// flaky, not as a difference.
func comparePgx(t *testing.T, name string, want, got pgxResults, env []string) bool {
	t.Helper()
	ok := true
	for k, reason := range notThroughAProxy {
		pkg, _, _ := strings.Cut(k, " ")
		if _, ran := want.outcome[pkg+" "]; ran && want.outcome[k] == "" {
			t.Errorf("%s: notThroughAProxy lists %s (%s), which pgx's suite does not have", name, k, reason)
			ok = false
		}
	}
	var keys []string
	for k := range want.outcome {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if strings.HasSuffix(k, " ") || want.outcome[k] != "pass" {
			continue // a package's own line, or not passing directly
		}
		o := got.outcome[k]
		if o == "" {
			o = "no result"
		}
		reason, listed := notThroughAProxy[k]
		switch {
		case o == "pass" && listed:
			t.Errorf("%s: %s passes, but is listed as unable to (%s): remove it from notThroughAProxy", name, k, reason)
			ok = false
		case o == "pass":
		case listed:
			t.Logf("%s: %s: %s, by its nature: %s", name, k, o, reason)
		case failsByListedOnly(got, k):
			t.Logf("%s: %s: %s, by its subtests listed above only", name, k, o)
		case rerunPasses(t, name, k, env):
			t.Logf("%s: %s: flaky: %s, then passed run again alone", name, k, o)
		default:
			t.Errorf("%s: %s passes directly but %s here:\n%s", name, k, o, got.output[k])
			ok = false
		}
	}
	return ok
}

// failsByListedOnly reports whether k did not pass only because subtests
// of it listed in notThroughAProxy did not: it printed nothing of its own
// but the lines go test frames a test with, and every subtest of it that
// did not pass is listed.
func failsByListedOnly(got pgxResults, k string) bool {
	for _, line := range strings.Split(strings.TrimSpace(got.output[k].String()), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "=== ") && !strings.HasPrefix(line, "--- FAIL") {
			return false
		}
	}
	listed := false
	for sub, o := range got.outcome {
		if !strings.HasPrefix(sub, k+"/") || o == "pass" {
			continue
		}
		if _, ok := notThroughAProxy[sub]; !ok && !failsByListedOnly(got, sub) {
			return false
		}
		listed = true
	}
	return listed
}

// rerunPasses runs test k (and its subtests) once more, alone, against the
// same target, and reports whether it passes.
func rerunPasses(t *testing.T, name, k string, env []string) bool {
	t.Helper()
	pkg, test, _ := strings.Cut(k, " ")
	if pkg == "pgx" {
		pkg = ""
	} else {
		pkg = "/" + pkg
	}
	top, _, _ := strings.Cut(test, "/")
	res := runPgx(t, name+" (rerun)", env, "-run", "^"+regexp.QuoteMeta(top)+"$", "github.com/jackc/pgx/v5"+pkg)
	return res.outcome[k] == "pass"
}
