package tlsreload

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/governor-project/governor/internal/testcert"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// reload is one report of OnReload.
type reload struct {
	cert *tls.Certificate
	err  error
}

func watch(t *testing.T, v *testcert.Volume, interval time.Duration) (*Reloader, chan reload) {
	t.Helper()
	ch := make(chan reload, 16)
	r, err := New(v.CertFile, v.KeyFile, Options{Interval: interval, OnReload: func(c *tls.Certificate, err error) { ch <- reload{c, err} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, ch
}

func next(t *testing.T, ch chan reload) reload {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10s")
	}
	return reload{}
}

// serve accepts TLS connections with r's certificate and echoes lines.
func serve(t *testing.T, r *Reloader) net.Listener {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: r.GetCertificate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadBytes('\n')
					if err != nil {
						return
					}
					c.Write(line)
				}
			}()
		}
	}()
	return ln
}

// dial makes a real handshake trusting both certificates and returns the
// connection and the certificate the server showed.
func dial(t *testing.T, addr string, roots *x509.CertPool) (*tls.Conn, *x509.Certificate) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, c.ConnectionState().PeerCertificates[0]
}

func echo(t *testing.T, c *tls.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		t.Fatalf("write on a connection made before the rotation: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != msg+"\n" {
		t.Fatalf("echo on a connection made before the rotation: %q %v", line, err)
	}
}

// TestRotation rotates a Secret-style volume as cert-manager does: new
// handshakes get the new certificate, a connection made before keeps
// working, and a pair that does not load leaves the one in force.
func TestRotation(t *testing.T) {
	a, b := testcert.New(t, "127.0.0.1"), testcert.New(t, "127.0.0.1")
	roots := testcert.Trusting(a, b)
	v := testcert.NewVolume(t, a.CertFile, a.KeyFile)
	r, reloads := watch(t, v, 5*time.Millisecond)
	ln := serve(t, r)

	old, got := dial(t, ln.Addr().String(), roots)
	if !bytes.Equal(got.Raw, a.TLS.Certificate[0]) {
		t.Fatal("the first handshake did not show the first certificate")
	}
	echo(t, old, "before")

	v.Rotate(b.CertFile, b.KeyFile)
	if rl := next(t, reloads); rl.err != nil || !bytes.Equal(rl.cert.Certificate[0], b.TLS.Certificate[0]) {
		t.Fatalf("reload: %v", rl.err)
	}
	if _, got := dial(t, ln.Addr().String(), roots); !bytes.Equal(got.Raw, b.TLS.Certificate[0]) {
		t.Error("a handshake after the rotation did not show the new certificate")
	}
	echo(t, old, "after")

	// cert-manager never writes a mismatched pair, but an operator might:
	// it is refused and reported, and b stays in force.
	v.Rotate(a.CertFile, b.KeyFile)
	if rl := next(t, reloads); rl.err == nil || rl.cert != nil {
		t.Fatalf("a mismatched pair loaded: %+v", rl)
	}
	if _, got := dial(t, ln.Addr().String(), roots); !bytes.Equal(got.Raw, b.TLS.Certificate[0]) {
		t.Error("a failed reload replaced the certificate in force")
	}
	echo(t, old, "still")
}

// TestHalfWrittenPair writes the certificate and then the key in place,
// polled by hand: a pair seen half-written once is not reported, and the
// whole pair then loads.
func TestHalfWrittenPair(t *testing.T) {
	a, b := testcert.New(t, "127.0.0.1"), testcert.New(t, "127.0.0.1")
	dir := t.TempDir()
	certFile, keyFile := dir+"/tls.crt", dir+"/tls.key"
	copyFile(t, a.CertFile, certFile)
	copyFile(t, a.KeyFile, keyFile)
	var reports []reload
	r, err := New(certFile, keyFile, Options{Interval: time.Hour, OnReload: func(c *tls.Certificate, err error) { reports = append(reports, reload{c, err}) }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	copyFile(t, b.CertFile, certFile)
	r.poller.Poll() // the certificate is new, the key old: seen once
	copyFile(t, b.KeyFile, keyFile)
	r.poller.Poll() // the whole pair: seen once
	if len(reports) != 0 {
		t.Fatalf("reported before the pair settled: %+v", reports)
	}
	r.poller.Poll()
	if len(reports) != 1 || reports[0].err != nil || !bytes.Equal(r.Certificate().Certificate[0], b.TLS.Certificate[0]) {
		t.Fatalf("after the pair settled: %+v", reports)
	}
	r.poller.Poll()
	if len(reports) != 1 {
		t.Errorf("an unchanged pair was reported again: %+v", reports)
	}

	// A key file that is gone for two polls is reported once; the pair in
	// force stays.
	os.Remove(keyFile)
	r.poller.Poll()
	r.poller.Poll()
	r.poller.Poll()
	if len(reports) != 2 || reports[1].err == nil || !bytes.Equal(r.Certificate().Certificate[0], b.TLS.Certificate[0]) {
		t.Errorf("a missing key: %+v", reports)
	}
}

func TestNewFails(t *testing.T) {
	a, b := testcert.New(t, "127.0.0.1"), testcert.New(t, "127.0.0.1")
	for _, files := range [][2]string{{a.CertFile, b.KeyFile}, {a.CertFile, t.TempDir() + "/none"}, {a.KeyFile, a.KeyFile}} {
		if r, err := New(files[0], files[1], Options{}); err == nil {
			r.Close()
			t.Errorf("New(%s, %s) loaded", files[0], files[1])
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
