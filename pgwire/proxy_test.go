package pgwire_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/governor-project/governor/pgwire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"))
}

// pgPort returns the test server's port, or skips.
func pgPort(t testing.TB) string {
	t.Helper()
	if os.Getenv("GOVERNOR_TEST_PG_DSN") == "" {
		t.Skip("GOVERNOR_TEST_PG_DSN is unset: run under scripts/testpg.sh (./test.sh does) for the tests against a real PostgreSQL")
	}
	return os.Getenv("GOVERNOR_TEST_PG_PORT")
}

// startProxy serves p on a fresh loopback port until the test ends.
func startProxy(t testing.TB, p *pgwire.Proxy) string {
	t.Helper()
	if p.Upstream == "" {
		p.Upstream = "127.0.0.1:" + pgPort(t)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Serve(ln) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-errc; !errors.Is(err, pgwire.ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func dsn(addr, user, pass, extra string) string {
	s := fmt.Sprintf("postgres://%s:%s@%s/governor?sslmode=disable", user, pass, addr)
	if extra != "" {
		s += "&" + extra
	}
	return s
}

func superDSN(addr string) string { return dsn(addr, "governor", "governor", "") }

func connect(t testing.TB, connString string) *pgx.Conn {
	t.Helper()
	return connectMode(t, connString, 0)
}

// connectMode is connect with pgx's default query exec mode set to mode;
// 0, which is no mode, keeps the connection string's.
func connectMode(t testing.TB, connString string, mode pgx.QueryExecMode) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		t.Fatalf("connect %s: %v", connString, err)
	}
	if mode != 0 {
		cfg.DefaultQueryExecMode = mode
	}
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", connString, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func exec1(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func TestPsql(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	host, port, _ := net.SplitHostPort(addr)
	script := `CREATE TEMP TABLE p (id int, s text);
INSERT INTO p VALUES (1, 'a;b'), (2, $$c'd$$);
\copy p from stdin
3	e
\.
BEGIN;
SELECT count(*) FROM p;
COMMIT;
SELECT string_agg(s, ',' ORDER BY id) FROM p;
`
	cmd := exec.Command("psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", "governor", "-d", "governor")
	cmd.Env = append(os.Environ(), "PGPASSWORD=governor", "PGSSLMODE=prefer")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if got := string(out); !strings.Contains(got, "3\n") || !strings.Contains(got, "a;b,c'd,e") {
		t.Fatalf("psql output:\n%s", got)
	}
}

func TestAuthMethods(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	for _, tc := range []struct{ user, pass string }{
		{"gov_md5", "md5pass"}, {"gov_scram", "scrampass"}, {"gov_password", "cleartextpass"}, {"gov_trust", ""},
	} {
		c := connect(t, dsn(addr, tc.user, tc.pass, ""))
		var who string
		if err := c.QueryRow(context.Background(), "SELECT current_user").Scan(&who); err != nil || who != tc.user {
			t.Fatalf("%s: current_user %q, %v", tc.user, who, err)
		}
	}
	ctx := context.Background()
	_, err := pgx.Connect(ctx, dsn(addr, "gov_scram", "wrong", ""))
	if sqlState(err) != "28P01" {
		t.Fatalf("wrong password: %v, want 28P01", err)
	}
}

// selfSigned makes a certificate for 127.0.0.1.
func selfSigned(t testing.TB) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pgwire-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestTLS(t *testing.T) {
	port := pgPort(t)
	cert := selfSigned(t)
	// Client leg TLS, upstream plain: SCRAM with the client's "y" flag.
	addr := startProxy(t, &pgwire.Proxy{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}})
	for _, user := range []struct{ u, p string }{{"gov_scram", "scrampass"}, {"gov_md5", "md5pass"}} {
		c := connect(t, strings.Replace(dsn(addr, user.u, user.p, ""), "sslmode=disable", "sslmode=require", 1))
		if !c.PgConn().Conn().(*tls.Conn).ConnectionState().HandshakeComplete {
			t.Fatal("client leg is not TLS")
		}
		var one int
		if err := c.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
			t.Fatal(err)
		}
	}
	// psql over TLS too.
	host, pport, _ := net.SplitHostPort(addr)
	out, err := exec.Command("psql", "-X", "-At", "-c", "SELECT 'tls ok'",
		fmt.Sprintf("host=%s port=%s user=gov_scram password=scrampass dbname=governor sslmode=require", host, pport)).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "tls ok" {
		t.Fatalf("psql over TLS: %v: %s", err, out)
	}

	ca := os.Getenv("GOVERNOR_TEST_PG_CA")
	if ca == "" {
		t.Log("GOVERNOR_TEST_PG_CA unset: the server has no TLS; upstream TLS not tested")
		return
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	// Upstream TLS: the server offers SCRAM-SHA-256-PLUS, the proxy hides it.
	up := startProxy(t, &pgwire.Proxy{Upstream: "127.0.0.1:" + port, UpstreamTLS: &tls.Config{RootCAs: roots}})
	for _, user := range []struct{ u, p string }{{"gov_scram", "scrampass"}, {"gov_md5", "md5pass"}, {"governor", "governor"}} {
		c := connect(t, dsn(up, user.u, user.p, ""))
		var ssl bool
		if err := c.QueryRow(context.Background(), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
			t.Fatalf("%s: upstream ssl %v, %v", user.u, ssl, err)
		}
	}
}

func tlsConfig(t testing.TB) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}
}
