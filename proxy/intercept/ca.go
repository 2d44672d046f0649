package intercept

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"
)

// CA is the certificate authority leaf certificates are signed with.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// The problems LoadCA and ParseCA report, wrapped with the detail: each
// names what is wrong, so that a start refused for it says what to fix.
var (
	ErrNotCA       = errors.New("the certificate is not a CA")
	ErrCAExpired   = errors.New("the CA is not valid now")
	ErrKeyMismatch = errors.New("the key does not match the CA certificate")
	ErrBadKey      = errors.New("the CA key does not load")
)

// LoadCA reads and checks a CA's certificate and key files (PEM). See
// ParseCA.
func LoadCA(certFile, keyFile string, now time.Time) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	return ParseCA(certPEM, keyPEM, now)
}

// ParseCA reads a CA's certificate and private key (PEM: a CERTIFICATE
// block; a PKCS#8, EC or PKCS#1 private key) and checks that it can sign
// leaves now: a CA certificate that may sign certificates, valid at now,
// whose public key is the key's.
func ParseCA(certPEM, keyPEM []byte, now time.Time) (*CA, error) {
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, err
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, fmt.Errorf("%w: its basic constraints do not say CA:TRUE", ErrNotCA)
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: its key usage does not allow signing certificates", ErrNotCA)
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%w: it is valid from %s to %s", ErrCAExpired,
			cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, ErrKeyMismatch
	}
	return &CA{Cert: cert, Key: key}, nil
}

func parseCert(certPEM []byte) (*x509.Certificate, error) {
	for rest := certPEM; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("no PEM CERTIFICATE block")
		}
		if b.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("the certificate does not parse: %w", err)
			}
			return cert, nil
		}
	}
}

func parseKey(keyPEM []byte) (crypto.Signer, error) {
	for rest := keyPEM; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, fmt.Errorf("%w: no PEM private key block", ErrBadKey)
		}
		var key any
		var err error
		switch b.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: the private key does not parse: %v", ErrBadKey, err)
		}
		s, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%w: a %T key cannot sign", ErrBadKey, key)
		}
		return s, nil
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}

// CAOptions are what NewCA makes.
type CAOptions struct {
	// Name is the CA's common name. "": "Governor interception CA".
	Name string
	// Validity is how long the CA is valid from now. Zero:
	// DefaultCAValidity.
	Validity time.Duration
	// Hosts, when not nil, are the only hosts the CA may sign for: the CA
	// carries X.509 name constraints for them (see NewCA).
	Hosts *Hosts
	// Now is the CA's start. Zero: time.Now().
	Now time.Time
}

// DefaultCAValidity is a made CA's validity when CAOptions leaves it out:
// long enough for a pod's life, short enough that a leaked key soon stops
// mattering.
const DefaultCAValidity = 90 * 24 * time.Hour

// NewCA makes a CA: an ECDSA P-256 key and a self-signed certificate that
// may sign server certificates only (no intermediate below it), returned as
// PEM. With o.Hosts, the certificate carries name constraints, marked
// critical: a name *.stripe.com permits the names below stripe.com, a name
// api.openai.com permits it and the names below it (X.509 cannot say "this
// name only"), an IP literal permits that address alone; with no names
// listed every name is refused, with no IP literal every address is. A
// leaked key then cannot sign for anything else, for clients that honour
// name constraints (docs/proxy.md says which).
func NewCA(o CAOptions) (certPEM, keyPEM []byte, err error) {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	validity := o.Validity
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	name := o.Name
	if name == "" {
		name = "Governor interception CA"
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Governor"}},
		NotBefore:             now.Add(-time.Minute), // clocks in a pod differ a little
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	if o.Hosts != nil {
		constrain(tmpl, o.Hosts)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// constrain sets the name constraints that permit h's hosts and nothing
// else.
func constrain(tmpl *x509.Certificate, h *Hosts) {
	tmpl.PermittedDNSDomainsCritical = true
	for name := range h.names {
		tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, name)
	}
	tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, h.suffixes...)
	if len(tmpl.PermittedDNSDomains) == 0 {
		// Only names under the reserved .invalid (RFC 2606): none real.
		tmpl.PermittedDNSDomains = []string{"invalid"}
	}
	for ip := range h.ips {
		bits := 32
		if ip.Is6() {
			bits = 128
		}
		tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, bits)})
	}
	if len(tmpl.PermittedIPRanges) == 0 {
		tmpl.ExcludedIPRanges = []*net.IPNet{
			{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
			{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		}
	}
	sortConstraints(tmpl)
}

// sortConstraints orders the constraints, so that the same hosts make the
// same certificate extension.
func sortConstraints(tmpl *x509.Certificate) {
	slices.Sort(tmpl.PermittedDNSDomains)
	ranges := tmpl.PermittedIPRanges
	for i := 1; i < len(ranges); i++ {
		for j := i; j > 0 && bytes.Compare(ranges[j].IP, ranges[j-1].IP) < 0; j-- {
			ranges[j], ranges[j-1] = ranges[j-1], ranges[j]
		}
	}
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// A Finding is one result of checking a CA's files for an operator
// (`governor doctor`).
type Finding struct {
	Kind    FindingKind
	Warn    bool // a problem; otherwise a fact
	Message string
}

// FindingKind is what a Finding is about, so that its reader can say how
// to fix it.
type FindingKind string

// The kinds of Finding Check makes.
const (
	FindingUnusable    FindingKind = "unusable"    // the files do not load as a CA that can sign now
	FindingExpiry      FindingKind = "expiry"      // when it expires
	FindingKeyMode     FindingKind = "key_mode"    // who may read the key file
	FindingConstraints FindingKind = "constraints" // the hosts it may sign for
)

// Check looks at a CA's files as an operator should before trusting them:
// whether they load as a CA valid now whose key matches, how long until it
// expires (a warning within warnWithin), and whether the key file can be
// read by anyone but its owner.
func Check(certFile, keyFile string, now time.Time, warnWithin time.Duration) []Finding {
	var out []Finding
	ca, err := LoadCA(certFile, keyFile, now)
	if err != nil {
		return append(out, Finding{Kind: FindingUnusable, Warn: true, Message: fmt.Sprintf("the CA in %s and %s cannot sign: %v", certFile, keyFile, err)})
	}
	left := ca.Cert.NotAfter.Sub(now)
	msg := fmt.Sprintf("the CA %q (%s) expires %s, in %s", ca.Cert.Subject.CommonName, certFile,
		ca.Cert.NotAfter.UTC().Format(time.RFC3339), left.Round(time.Minute))
	out = append(out, Finding{Kind: FindingExpiry, Warn: left < warnWithin, Message: msg})
	if fi, err := os.Stat(keyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
		out = append(out, Finding{Kind: FindingKeyMode, Warn: true, Message: fmt.Sprintf("the CA key %s is readable by others (mode %04o); chmod 600 it", keyFile, fi.Mode().Perm())})
	}
	if len(ca.Cert.PermittedDNSDomains) > 0 || len(ca.Cert.PermittedIPRanges) > 0 {
		out = append(out, Finding{Kind: FindingConstraints, Message: fmt.Sprintf("the CA may sign only for %s (name constraints)",
			constrainedTo(ca.Cert))})
	}
	return out
}

// constrainedTo lists what a CA's name constraints permit, as hosts are
// written: a ".domain" constraint as "*.domain", the "invalid" of a CA
// that permits no name left out.
func constrainedTo(c *x509.Certificate) string {
	var out []string
	for _, d := range c.PermittedDNSDomains {
		switch {
		case d == "invalid":
		case strings.HasPrefix(d, "."):
			out = append(out, "*"+d)
		default:
			out = append(out, d)
		}
	}
	out = append(out, ipRanges(c.PermittedIPRanges)...)
	if len(out) == 0 {
		return "nothing"
	}
	return strings.Join(out, ", ")
}

func ipRanges(rs []*net.IPNet) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		if p, err := netip.ParsePrefix(r.String()); err == nil && p.IsSingleIP() {
			out = append(out, p.Addr().String())
			continue
		}
		out = append(out, r.String())
	}
	return out
}
