package intercept

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func newCA(t testing.TB, hosts *Hosts, validity time.Duration) *CA {
	t.Helper()
	c, k, err := NewCA(CAOptions{Hosts: hosts, Validity: validity, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseCA(c, k, t0)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustHosts(t testing.TB, entries ...string) *Hosts {
	t.Helper()
	h, err := ParseHosts(entries)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHosts(t *testing.T) {
	h := mustHosts(t, "api.openai.com", "*.Stripe.com.", "127.0.0.1", "[::1]", "::ffff:10.0.0.1")
	for host, want := range map[string]bool{
		"api.openai.com": true, "API.OpenAI.com.": true, "openai.com": false, "x.api.openai.com": false,
		"api.stripe.com": true, "a.b.stripe.com": true, "stripe.com": false, "evilstripe.com": false,
		"127.0.0.1": true, "127.0.0.2": false, "::1": true, "[::1]": true, "10.0.0.1": true, "": false,
	} {
		if got := h.Match(host); got != want {
			t.Errorf("Match(%q) = %v, want %v", host, got, want)
		}
	}
	for _, bad := range []string{"", "api*.openai.com", "*", "*.", "a..b", "fe80::1%eth0", "exa mple.com", strings.Repeat("a", 64) + ".com"} {
		if _, err := ParseHosts([]string{"ok.example", bad}); err == nil || !strings.HasPrefix(err.Error(), "[1] ") {
			t.Errorf("ParseHosts accepted %q or did not name it: %v", bad, err)
		}
	}
}

// A CA is refused, naming the problem, when it is not a CA, is not valid
// now, or its key is another's.
func TestParseCARefusesWhatCannotSign(t *testing.T) {
	certPEM, keyPEM, err := NewCA(CAOptions{Now: t0, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, _ := NewCA(CAOptions{Now: t0})
	notCA := selfSigned(t, false)
	for _, tc := range []struct {
		name      string
		cert, key []byte
		now       time.Time
		want      error
		text      string
	}{
		{"expired", certPEM, keyPEM, t0.Add(2 * time.Hour), ErrCAExpired, "valid from"},
		{"not yet valid", certPEM, keyPEM, t0.Add(-time.Hour), ErrCAExpired, "valid from"},
		{"another's key", certPEM, otherKey, t0, ErrKeyMismatch, ""},
		{"not a CA", notCA[0], notCA[1], t0, ErrNotCA, "CA:TRUE"},
		{"no certificate", keyPEM, keyPEM, t0, nil, "no PEM CERTIFICATE"},
		{"no key", certPEM, certPEM, t0, nil, "no PEM private key"},
	} {
		_, err := ParseCA(tc.cert, tc.key, tc.now)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := ParseCA(certPEM, keyPEM, t0); err != nil {
		t.Errorf("a good CA: %v", err)
	}
}

// selfSigned is a certificate that is not a CA, and its key.
func selfSigned(t *testing.T, isCA bool) [2][]byte {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(time.Hour), BasicConstraintsValid: true, IsCA: isCA}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := x509.MarshalPKCS8PrivateKey(key)
	return [2][]byte{pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k})}
}

func verify(ca *CA, leaf *x509.Certificate, host string, at time.Time) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, CurrentTime: at})
	return err
}

// Leaves verify for their host, DNS name or IP, and the chain carries the CA.
func TestLeavesVerify(t *testing.T) {
	ca := newCA(t, nil, 0)
	m := NewMinter(ca)
	m.Now = func() time.Time { return t0 }
	for _, host := range []string{"api.openai.com", "127.0.0.1", "::1"} {
		c, err := m.Leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		if err := verify(ca, c.Leaf, host, t0); err != nil {
			t.Errorf("%s: %v", host, err)
		}
		if err := verify(ca, c.Leaf, "other.example", t0); err == nil {
			t.Errorf("%s's leaf verifies for another host", host)
		}
		if len(c.Certificate) != 2 || string(c.Certificate[1]) != string(ca.Cert.Raw) {
			t.Errorf("%s: the chain is not leaf then CA", host)
		}
		if got := c.Leaf.NotAfter.Sub(t0); got != DefaultLeafValidity {
			t.Errorf("%s: valid for %v after now", host, got)
		}
		if _, ok := c.Leaf.PublicKey.(*ecdsa.PublicKey); !ok || c.Leaf.PublicKey.(*ecdsa.PublicKey).Curve != elliptic.P256() {
			t.Errorf("%s: the key is not ECDSA P-256", host)
		}
	}
}

// A CA made for some hosts carries name constraints that refuse any other:
// a certificate signed for another name, or any IP, does not verify.
func TestNameConstraints(t *testing.T) {
	hosts := mustHosts(t, "api.openai.com", "*.stripe.com", "127.0.0.1")
	ca := newCA(t, hosts, 0)
	m := NewMinter(ca)
	m.Now = func() time.Time { return t0 }
	for host, ok := range map[string]bool{
		"api.openai.com": true, "api.stripe.com": true, "x.y.stripe.com": true, "127.0.0.1": true,
		"stripe.com": false, "www.google.com": false, "127.0.0.2": false, "::1": false, "openai.com": false,
	} {
		c, err := m.Leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		if err := verify(ca, c.Leaf, host, t0); (err == nil) != ok {
			t.Errorf("%s: verify says %v, want ok=%v", host, err, ok)
		}
	}
	checkIPLeafWithOpenSSL(t, ca, m)
	onlyIPs := newCA(t, mustHosts(t, "10.1.2.3"), 0)
	m = NewMinter(onlyIPs)
	m.Now = func() time.Time { return t0 }
	c, _ := m.Leaf("example.com")
	if err := verify(onlyIPs, c.Leaf, "example.com", t0); err == nil {
		t.Error("a CA for an IP alone signed a name that verifies")
	}
}

// checkIPLeafWithOpenSSL: an IP leaf has no common name, since OpenSSL
// (curl, Python, Node) checks the common name of a leaf with no DNS name
// against the CA's DNS name constraints, and refuses it when it looks like
// a name the CA does not permit. With openssl installed, openssl verify
// says so itself.
func checkIPLeafWithOpenSSL(t *testing.T, ca *CA, m *Minter) {
	t.Helper()
	c, err := m.Leaf("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if cn := c.Leaf.Subject.CommonName; cn != "" {
		t.Errorf("the leaf of 127.0.0.1 has the common name %q", cn)
	}
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Log("openssl is not installed: the leaf is not shown to it")
		return
	}
	dir := t.TempDir()
	caFile, leafFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "leaf.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644)
	os.WriteFile(leafFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Leaf.Raw}), 0o644)
	// -attime: the leaves are minted at t0, not now.
	out, err := exec.Command(openssl, "verify", "-attime", strconv.FormatInt(t0.Unix(), 10), "-CAfile", caFile, leafFile).CombinedOutput()
	if err != nil {
		t.Errorf("openssl verify refuses the leaf of 127.0.0.1 from a CA that permits it: %v\n%s", err, out)
	}
}

// Many first requests for one host mint once; each host is minted once.
func TestConcurrentFirstRequestsMintOnce(t *testing.T) {
	m := NewMinter(newCA(t, nil, 0))
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.Leaf(fmt.Sprintf("host%d.example", i%4)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := m.Minted(); n != 4 {
		t.Errorf("%d leaves minted for 4 hosts", n)
	}
}

// The cache holds at most MaxLeaves, the least recently used going first;
// 1,000 hosts minted into a bound of 100 keep 100, and the heap they hold
// is reported.
func TestCacheIsBounded(t *testing.T) {
	m := NewMinter(newCA(t, nil, 0))
	m.MaxLeaves = 100
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 1000 {
		if _, err := m.Leaf(fmt.Sprintf("h%d.example", i)); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 { // keep h0 recently used: it must survive
			m.Leaf("h0.example")
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := m.Cached(); n != 100 {
		t.Errorf("%d leaves cached, bound 100", n)
	}
	minted := m.Minted()
	m.Leaf("h0.example")
	m.Leaf("h999.example")
	if m.Minted() != minted {
		t.Error("a recently used leaf was evicted")
	}
	m.Leaf("h1.example")
	if m.Minted() != minted+1 {
		t.Error("the least recently used leaf was kept")
	}
	t.Logf("1,000 hosts minted, 100 kept: %d bytes of heap held (%.1f KiB a leaf)",
		int64(after.HeapAlloc)-int64(before.HeapAlloc), float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/100/1024)
}

// A leaf is minted again before it expires, and when the CA changes; one
// capped by a CA about to expire is kept rather than minted on every call.
func TestRenewal(t *testing.T) {
	now := t0
	ca := newCA(t, nil, 0)
	m := NewMinter(ca)
	m.Now = func() time.Time { return now }
	first, _ := m.Leaf("a.example")
	now = now.Add(DefaultLeafValidity - DefaultRenewBefore - time.Minute)
	if c, _ := m.Leaf("a.example"); c != first {
		t.Error("a fresh leaf was minted again")
	}
	now = now.Add(2 * time.Minute)
	second, _ := m.Leaf("a.example")
	if second == first || !second.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Error("a leaf about to expire was not renewed")
	}
	m.SetCA(newCA(t, nil, 0))
	if c, _ := m.Leaf("a.example"); c == second {
		t.Error("a leaf of the old CA was handed out after the CA changed")
	}
	short := newCA(t, nil, time.Hour) // expires before DefaultRenewBefore
	m = NewMinter(short)
	now = t0
	m.Now = func() time.Time { return now }
	c1, _ := m.Leaf("b.example")
	now = now.Add(10 * time.Minute)
	if c2, _ := m.Leaf("b.example"); c2 != c1 || m.Minted() != 1 {
		t.Error("a leaf the CA caps was minted again on every call")
	}
	now = t0.Add(2 * time.Hour)
	if _, err := m.Leaf("c.example"); !errors.Is(err, ErrCAExpired) {
		t.Errorf("minting past the CA's end: %v", err)
	}
}

// Watch puts a new CA in force and rejects one that does not load.
func TestWatchReloadsTheCA(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	// Each file replaced whole, by a rename, as a Secret's volume swaps
	// them: the poller never reads one half written.
	write := func(c, k []byte) {
		for f, data := range map[string][]byte{certFile: c, keyFile: k} {
			os.WriteFile(f+".new", data, 0o600)
			os.Rename(f+".new", f)
		}
	}
	c1, k1, _ := NewCA(CAOptions{})
	write(c1, k1)
	ca, err := LoadCA(certFile, keyFile, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m := NewMinter(ca)
	reloads := make(chan error, 10)
	w, err := Watch(m, certFile, keyFile, 5*time.Millisecond, func(err error) { reloads <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c2, k2, _ := NewCA(CAOptions{Name: "second"})
	write(c2, k2)
	if err := <-reloads; err != nil || m.CA().Cert.Subject.CommonName != "second" {
		t.Fatalf("reload: %v, CA %q", err, m.CA().Cert.Subject.CommonName)
	}
	write(c1, k2) // a key that is not the certificate's
	if err := <-reloads; !errors.Is(err, ErrKeyMismatch) || m.CA().Cert.Subject.CommonName != "second" {
		t.Fatalf("a mismatched pair: %v, CA %q", err, m.CA().Cert.Subject.CommonName)
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	c, k, _ := NewCA(CAOptions{Now: t0, Validity: 48 * time.Hour, Hosts: mustHosts(t, "api.openai.com")})
	os.WriteFile(certFile, c, 0o644)
	os.WriteFile(keyFile, k, 0o644)
	fs := Check(certFile, keyFile, t0.Add(time.Hour), 7*24*time.Hour)
	text := fmt.Sprint(fs)
	for _, want := range []string{"expires 2026-12-06T12:00:00Z, in 47h0m0s", "readable by others (mode 0644)", "may sign only for api.openai.com (name constraints)"} {
		if !strings.Contains(text, want) {
			t.Errorf("Check does not say %q: %s", want, text)
		}
	}
	if !fs[0].Warn || fs[0].Kind != FindingExpiry || fs[1].Kind != FindingKeyMode || fs[2].Kind != FindingConstraints {
		t.Errorf("a CA expiring within the warning window, its key readable by others: %+v", fs)
	}
	if fs := Check(certFile, keyFile, t0.Add(72*time.Hour), time.Hour); !fs[0].Warn || fs[0].Kind != FindingUnusable || !strings.Contains(fs[0].Message, "cannot sign") {
		t.Errorf("an expired CA: %v", fs)
	}
}
