// Package testcert makes throwaway self-signed TLS certificates for tests.
// It may import only the standard library.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Cert is a self-signed server certificate, as files and in memory.
type Cert struct {
	CertFile string // PEM certificate; also the CA file a client trusts
	KeyFile  string // PEM private key
	TLS      tls.Certificate
	Pool     *x509.CertPool // trusts only this certificate
}

// New makes a certificate valid for an hour for hosts, each an IP address
// or a DNS name, and writes it to t's temporary folder.
func New(t testing.TB, hosts ...string) Cert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "governor test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := Cert{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"),
		TLS: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, Pool: x509.NewCertPool()}
	if err := os.WriteFile(c.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	c.TLS.Leaf = leaf
	c.Pool.AddCert(leaf)
	return c
}

// Trusting is a pool that trusts each of certs, as a client that knows a
// rotation's old and new certificates does.
func Trusting(certs ...Cert) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c.TLS.Leaf)
	}
	return pool
}

// Volume is a folder laid out as the kubelet mounts a Kubernetes Secret,
// which is how cert-manager's certificates reach a pod: tls.crt and tls.key
// are symlinks into "..data", itself a symlink to a timestamped folder.
// Rotate writes a new folder and swaps "..data" to it in one rename, so a
// reader sees the old pair or the new one, never half of each.
type Volume struct {
	Dir      string
	CertFile string // Dir/tls.crt
	KeyFile  string // Dir/tls.key
	t        testing.TB
	n        int
}

// NewVolume makes a Volume holding the pair in certFile and keyFile.
func NewVolume(t testing.TB, certFile, keyFile string) *Volume {
	t.Helper()
	v := &Volume{Dir: t.TempDir(), t: t}
	v.CertFile, v.KeyFile = filepath.Join(v.Dir, "tls.crt"), filepath.Join(v.Dir, "tls.key")
	v.Rotate(certFile, keyFile)
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.Dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// Rotate makes the pair in certFile and keyFile the Volume's, atomically.
func (v *Volume) Rotate(certFile, keyFile string) {
	v.t.Helper()
	v.n++
	gen := fmt.Sprintf("..%s_%d", time.Now().UTC().Format("2006_01_02_15_04_05"), v.n)
	if err := os.Mkdir(filepath.Join(v.Dir, gen), 0o700); err != nil {
		v.t.Fatal(err)
	}
	for name, from := range map[string]string{"tls.crt": certFile, "tls.key": keyFile} {
		b, err := os.ReadFile(from)
		if err != nil {
			v.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v.Dir, gen, name), b, 0o600); err != nil {
			v.t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}
