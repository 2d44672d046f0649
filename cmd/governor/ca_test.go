package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/proxy/intercept"
)

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// verifiesFor reports whether a leaf the CA's key signs for host verifies
// against the CA alone, as a client trusting ca.pem checks it.
func verifiesFor(t *testing.T, ca *intercept.CA, host string) bool {
	t.Helper()
	leaf, err := intercept.NewMinter(ca).Leaf(host)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err = leaf.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host})
	return err == nil
}

// TestCACreate runs `governor ca create` as a user does and checks what it
// wrote: the modes, that the sidecar's loader takes the pair, the name
// constraints -hosts asks for (a leaf for another host does not verify),
// the bundle, and that existing files are replaced only with -force.
func TestCACreate(t *testing.T) {
	bin := buildCLI(t)
	dir := filepath.Join(t.TempDir(), "governor-ca") // made by the command
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	before := time.Now()
	code, out, errOut := runCLI(t, bin, "", "ca", "create", "-out", dir, "-hosts", "api.example.com, *.stripe.com,127.0.0.1",
		"-validity", "30d", "-name", "Pod CA")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if m := fileMode(t, certFile); m != 0o644 {
		t.Errorf("ca.pem has mode %04o, want 0644", m)
	}
	if m := fileMode(t, keyFile); m != 0o600 {
		t.Errorf("ca-key.pem has mode %04o, want 0600", m)
	}
	ca, err := intercept.LoadCA(certFile, keyFile, time.Now())
	if err != nil {
		t.Fatalf("the sidecar's loader refuses the pair: %v", err)
	}
	c := ca.Cert
	// A certificate's times are whole seconds.
	if c.Subject.CommonName != "Pod CA" || c.NotAfter.Before(before.Add(30*24*time.Hour-time.Second)) || c.NotAfter.After(time.Now().Add(30*24*time.Hour)) {
		t.Errorf("the CA is %q, valid until %v; want Pod CA, 30 days from now", c.Subject.CommonName, c.NotAfter)
	}
	for _, want := range []string{"wrote " + certFile, "wrote " + keyFile, "mode 0600",
		"expires " + c.NotAfter.UTC().Format(time.RFC3339), "(in 30d)", "may sign only for api.example.com, *.stripe.com, 127.0.0.1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if !c.PermittedDNSDomainsCritical || !slices.Equal(c.PermittedDNSDomains, []string{".stripe.com", "api.example.com"}) ||
		len(c.PermittedIPRanges) != 1 || c.PermittedIPRanges[0].String() != "127.0.0.1/32" {
		t.Errorf("name constraints (critical %v): %v %v", c.PermittedDNSDomainsCritical, c.PermittedDNSDomains, c.PermittedIPRanges)
	}
	for host, ok := range map[string]bool{"api.example.com": true, "api.stripe.com": true, "127.0.0.1": true,
		"evil.example": false, "stripe.com": false, "127.0.0.2": false} {
		if got := verifiesFor(t, ca, host); got != ok {
			t.Errorf("a leaf for %s verifies: %v, want %v", host, got, ok)
		}
	}

	// The files are there: nothing is replaced without -force.
	certBefore, _ := os.ReadFile(certFile)
	keyBefore, _ := os.ReadFile(keyFile)
	code, out, errOut = runCLI(t, bin, "", "ca", "create", "-out", dir)
	if code != 1 || out != "" || !strings.Contains(errOut, "exists; -force replaces it") {
		t.Errorf("a second create: exit %d\n%s%s", code, out, errOut)
	}
	if now, _ := os.ReadFile(certFile); !bytes.Equal(now, certBefore) {
		t.Error("ca.pem changed without -force")
	}
	if now, _ := os.ReadFile(keyFile); !bytes.Equal(now, keyBefore) {
		t.Error("ca-key.pem changed without -force")
	}

	// -force replaces them; a key readable by others is made 0600 again.
	os.Chmod(keyFile, 0o644)
	roots := testcert.New(t, "127.0.0.1")
	code, out, errOut = runCLI(t, bin, "", "ca", "create", "-out", dir, "-force", "-bundle-roots", roots.CertFile)
	if code != 0 {
		t.Fatalf("create -force: exit %d\n%s%s", code, out, errOut)
	}
	if now, _ := os.ReadFile(keyFile); bytes.Equal(now, keyBefore) {
		t.Error("-force kept the old key")
	}
	if m := fileMode(t, keyFile); m != 0o600 {
		t.Errorf("the replaced ca-key.pem has mode %04o, want 0600", m)
	}
	ca, err = intercept.LoadCA(certFile, keyFile, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(ca.Cert.PermittedDNSDomains)+len(ca.Cert.PermittedIPRanges) != 0 || !strings.Contains(out, "no name constraints") ||
		!verifiesFor(t, ca, "evil.example") {
		t.Errorf("without -hosts the CA should sign for any host, and say so:\n%s", out)
	}
	if d := ca.Cert.NotAfter.Sub(time.Now()); d < 89*24*time.Hour || d > 90*24*time.Hour {
		t.Errorf("the default validity: %v, want 90 days", d)
	}

	// The bundle: the roots file's certificates, then the CA.
	bundleFile := filepath.Join(dir, "bundle.pem")
	if m := fileMode(t, bundleFile); m != 0o644 {
		t.Errorf("bundle.pem has mode %04o, want 0644", m)
	}
	bundle, _ := os.ReadFile(bundleFile)
	var subjects []string
	for rest := bundle; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		subjects = append(subjects, cert.Subject.CommonName)
	}
	rootCert, _ := testcertLeaf(t, roots.CertFile)
	if !slices.Equal(subjects, []string{rootCert.Subject.CommonName, "Governor interception CA"}) || !strings.Contains(out, "wrote "+bundleFile) {
		t.Errorf("bundle.pem holds %q, want the roots then the CA\n%s", subjects, out)
	}
}

func testcertLeaf(t *testing.T, file string) (*x509.Certificate, error) {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(text)
	return x509.ParseCertificate(b.Bytes)
}

// Bad flags exit 2 with a message naming the flag, and write nothing.
func TestCACreateBadFlags(t *testing.T) {
	bin := buildCLI(t)
	tmp := t.TempDir()
	noCerts := filepath.Join(tmp, "empty.pem")
	os.WriteFile(noCerts, []byte("# no certificate here\n"), 0o644)
	dir := filepath.Join(tmp, "out")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-validity", "0d"}, "-validity: 0d is not a positive duration"},
		{[]string{"-validity", "-2h"}, "-validity: -2h is not a positive duration"},
		{[]string{"-validity", "90 days"}, `-validity: "90 days" is not a number of days`},
		{[]string{"-validity", "1.5d"}, `-validity: "1.5d" is not a number of days`},
		{[]string{"-validity", "3651d"}, "-validity: 3651d is longer than 3650d"},
		{[]string{"-validity", "100000h"}, "-validity: 100000h is longer than 3650d"},
		{[]string{"-hosts", "api*.example.com"}, `-hosts: entry [0] "api*.example.com"`},
		{[]string{"-hosts", "ok.example,,x.example"}, `-hosts: entry [1] "": is empty`},
		{[]string{"-hosts", ""}, `-hosts: entry [0] "": is empty`},
		{[]string{"-name", " "}, "-name: the CA's common name is empty"},
		{[]string{"-bundle-roots", filepath.Join(tmp, "missing.pem")}, "-bundle-roots: open "},
		{[]string{"-bundle-roots", noCerts}, "-bundle-roots: " + noCerts + " holds no PEM certificate"},
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
	} {
		args := append([]string{"ca", "create", "-out", dir}, tc.args...)
		code, out, errOut := runCLI(t, bin, "", args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	if code, _, errOut := runCLI(t, bin, "", "ca", "create", "-hosts", "api.example.com"); code != 2 || !strings.Contains(errOut, "-out is required") {
		t.Errorf("no -out: exit %d, %q", code, errOut)
	}
	if code, _, _ := runCLI(t, bin, "", "ca", "destroy"); code != 2 {
		t.Errorf("ca destroy: exit %d, want 2", code)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("bad flags wrote %s: %v", dir, err)
	}
}
