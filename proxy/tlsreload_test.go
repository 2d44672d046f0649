package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/pgwire"
)

// sslHandshake opens a connection to a pgwire listener, asks for TLS with
// an SSLRequest as libpq does, completes the handshake trusting roots, and
// returns the certificate the listener showed.
func sslHandshake(t *testing.T, addr string, roots *x509.CertPool) []byte {
	t.Helper()
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(waitFor))
	req := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), pgwire.CodeSSLRequest)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(c, answer[:]); err != nil || answer[0] != 'S' {
		t.Fatalf("SSLRequest: %q %v, want S", answer, err)
	}
	tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	return tc.ConnectionState().PeerCertificates[0].Raw
}

// echoSQL runs a query that answers what it is given.
func echoSQL(t *testing.T, c *pgx.Conn, what string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var got string
	if err := c.QueryRow(ctx, "SELECT $1::text", what).Scan(&got); err != nil {
		t.Fatalf("SELECT %q: %v", what, err)
	}
	return got
}

// TestPGWireCertificateRotates rotates a pgwire listener's certificate as
// cert-manager does (a Secret volume's "..data" symlink swapped to a new
// folder): a new handshake gets the new certificate, a pair that does not
// load is refused and counted with the new one still in force, and, with
// a PostgreSQL to relay to, a connection opened before keeps working over
// its TLS session. No restart.
func TestPGWireCertificateRotates(t *testing.T) {
	a, b := testcert.New(t, "127.0.0.1"), testcert.New(t, "127.0.0.1")
	roots := x509.NewCertPool()
	var bundle []byte
	for _, c := range []testcert.Cert{a, b} {
		pem, err := os.ReadFile(c.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		roots.AppendCertsFromPEM(pem)
		bundle = append(bundle, pem...)
	}
	bundleFile := filepath.Join(t.TempDir(), "bundle.pem")
	must(t, os.WriteFile(bundleFile, bundle, 0o600))
	v := testcert.NewVolume(t, a.CertFile, a.KeyFile)

	up := "127.0.0.1:1" // the handshake comes before the upstream is dialed
	withPG := os.Getenv("GOVERNOR_TEST_PG_DSN") != ""
	if withPG {
		up = pgUpstream(t)
	}
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), opts: func(o *Options) { o.ReloadInterval = 5 * time.Millisecond },
		yaml: fmt.Sprintf("pgwire:\n  - {listen: 127.0.0.1:0, upstream: %s, tls: {cert_file: %q, key_file: %q}}\n", up, v.CertFile, v.KeyFile)})
	addr := p.PGWireAddrs()[0]
	if !bytes.Equal(sslHandshake(t, addr, roots), a.TLS.Certificate[0]) {
		t.Fatal("the first handshake did not show the first certificate")
	}
	dsn := fmt.Sprintf("postgres://governor:governor@%s/governor?sslmode=verify-full&sslrootcert=%s", addr, bundleFile)
	var old *pgx.Conn // opened before the rotation
	if withPG {
		old = pgConnect(t, dsn)
		if got := echoSQL(t, old, "before"); got != "before" {
			t.Fatalf("a query before the rotation: %q", got)
		}
	}

	v.Rotate(b.CertFile, b.KeyFile)
	eventually(t, "the reload", func() bool { return p.metric(`governor_proxy_tls_reloads_total{outcome="success"}`) == 1 })
	if !bytes.Equal(sslHandshake(t, addr, roots), b.TLS.Certificate[0]) {
		t.Error("a handshake after the rotation did not show the new certificate")
	}
	if withPG {
		if got := echoSQL(t, old, "after"); got != "after" {
			t.Errorf("a query after the rotation, on the connection opened before: %q", got)
		}
		tc, ok := old.PgConn().Conn().(*tls.Conn)
		if !ok || !bytes.Equal(tc.ConnectionState().PeerCertificates[0].Raw, a.TLS.Certificate[0]) {
			t.Error("the connection opened before the rotation is not the TLS session it was")
		}
		if got := echoSQL(t, pgConnect(t, dsn), "new"); got != "new" {
			t.Errorf("a new connection after the rotation: %q", got)
		}
	}

	v.Rotate(a.CertFile, b.KeyFile) // a certificate with another's key
	eventually(t, "the failed reload", func() bool { return p.metric(`governor_proxy_tls_reloads_total{outcome="failure"}`) == 1 })
	if !bytes.Equal(sslHandshake(t, addr, roots), b.TLS.Certificate[0]) {
		t.Error("a pair that failed to load replaced the certificate in force")
	}
	out := p.logs.String()
	if !strings.Contains(out, "governor-proxy: TLS certificate reloaded") ||
		!strings.Contains(out, "governor-proxy: the TLS certificate failed to load; the one in force stays") {
		t.Errorf("the log does not show the reload and the failure:\n%s", out)
	}
}
