package governor_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/governor-project/governor/governor"
)

// selfSigned makes a certificate for the fake's name ("fake", the authority
// of passthrough:///fake) and writes it as PEM to a file.
func selfSigned(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake"},
		DNSNames: []string{"fake"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, path
}

func TestCAFileTurnsTLSOnAndTrustsOnlyIt(t *testing.T) {
	cert, caFile := selfSigned(t)
	_, otherCA := selfSigned(t)
	opts := serveFake(t, newFake(time.Minute), grpc.Creds(credentials.NewServerTLSFromCert(&cert)))

	t.Run("option", func(t *testing.T) {
		c, err := governor.Dial(t.Context(), append(opts, governor.WithCAFile(caFile))...)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv(governor.EnvCAFile, caFile)
		t.Setenv(governor.EnvTLS, "false") // the CA file still turns TLS on
		c, err := governor.Dial(t.Context(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	})
	for name, opt := range map[string]governor.Option{
		"another CA":   governor.WithCAFile(otherCA),
		"system roots": governor.WithTLS(true),
		"plaintext":    governor.WithTLS(false),
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			_, err := governor.Dial(ctx, append(opts, opt)...)
			if !errors.Is(err, governor.ErrUnavailable) {
				t.Fatalf("Dial = %v, want ErrUnavailable", err)
			}
		})
	}
}
