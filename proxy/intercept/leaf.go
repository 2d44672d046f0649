package intercept

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of the Minter's zero fields.
const (
	// DefaultLeafValidity: a leaf is valid this long from when it is
	// minted (and never past the CA).
	DefaultLeafValidity = 24 * time.Hour
	// DefaultRenewBefore: a cached leaf is minted again once less than
	// this is left of it.
	DefaultRenewBefore = 2 * time.Hour
	// DefaultMaxLeaves bounds the leaves kept; the least recently used
	// goes first.
	DefaultMaxLeaves = 1024
	// leafBackdate covers clocks that run a little behind the sidecar's.
	leafBackdate = time.Hour
)

// Minter mints and caches the leaf certificate of each intercepted host:
// an ECDSA P-256 key and a certificate signed by the CA naming the host (a
// DNS name or an IP address), valid for Validity. Set its fields before the
// first Leaf; it is safe for concurrent use.
type Minter struct {
	// Validity, RenewBefore and MaxLeaves: zero is their Default.
	Validity    time.Duration
	RenewBefore time.Duration
	MaxLeaves   int
	// Now is the clock. Nil: time.Now.
	Now func() time.Time

	ca     atomic.Pointer[CA]
	minted atomic.Uint64

	mu      sync.Mutex
	lru     *list.List // of *cached, most recently used first
	byHost  map[string]*list.Element
	flights map[string]*flight
}

type cached struct {
	host string
	cert *tls.Certificate
	ca   *CA // the CA it was signed by: a new CA makes it stale
}

// flight is a mint in progress, which the other first requests for its
// host wait for.
type flight struct {
	done chan struct{}
	cert *tls.Certificate
	err  error
}

// NewMinter returns a Minter signing with ca.
func NewMinter(ca *CA) *Minter {
	m := &Minter{}
	m.SetCA(ca)
	return m
}

// SetCA makes ca the one leaves are signed with from now on. Leaves signed
// by the CA before are minted again when next asked for.
func (m *Minter) SetCA(ca *CA) { m.ca.Store(ca) }

// CA is the CA in force.
func (m *Minter) CA() *CA { return m.ca.Load() }

// Minted is how many leaves have been minted.
func (m *Minter) Minted() uint64 { return m.minted.Load() }

// Cached is how many leaves are kept.
func (m *Minter) Cached() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lru == nil {
		return 0
	}
	return m.lru.Len()
}

func (m *Minter) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Leaf returns host's certificate, with the CA's after it in the chain:
// the cached one while it is fresh, or one minted now. Concurrent first
// requests for a host mint once.
func (m *Minter) Leaf(host string) (*tls.Certificate, error) {
	host = canonical(host)
	ca := m.ca.Load()
	now := m.now()
	m.mu.Lock()
	if m.byHost == nil {
		m.lru, m.byHost, m.flights = list.New(), map[string]*list.Element{}, map[string]*flight{}
	}
	if e := m.byHost[host]; e != nil {
		c := e.Value.(*cached)
		if c.ca == ca && m.fresh(c.cert.Leaf, ca, now) {
			m.lru.MoveToFront(e)
			m.mu.Unlock()
			return c.cert, nil
		}
	}
	f := m.flights[host]
	if f == nil {
		f = &flight{done: make(chan struct{})}
		m.flights[host] = f
		m.mu.Unlock()
		f.cert, f.err = m.mint(ca, host, now)
		m.mu.Lock()
		delete(m.flights, host)
		if f.err == nil {
			m.keep(&cached{host: host, cert: f.cert, ca: ca})
		}
		m.mu.Unlock()
		close(f.done)
	} else {
		m.mu.Unlock()
		<-f.done
	}
	return f.cert, f.err
}

// fresh reports whether a leaf can still be handed out: more than
// RenewBefore left, or as much as the CA itself allows.
func (m *Minter) fresh(leaf *x509.Certificate, ca *CA, now time.Time) bool {
	renew := m.RenewBefore
	if renew <= 0 {
		renew = DefaultRenewBefore
	}
	if !now.Before(leaf.NotAfter) {
		return false
	}
	return leaf.NotAfter.Sub(now) > renew || !leaf.NotAfter.Before(ca.Cert.NotAfter)
}

// keep caches c, dropping the least recently used past MaxLeaves. m.mu is
// held.
func (m *Minter) keep(c *cached) {
	if e := m.byHost[c.host]; e != nil {
		e.Value = c
		m.lru.MoveToFront(e)
		return
	}
	m.byHost[c.host] = m.lru.PushFront(c)
	limit := m.MaxLeaves
	if limit <= 0 {
		limit = DefaultMaxLeaves
	}
	for m.lru.Len() > limit {
		old := m.lru.Back()
		m.lru.Remove(old)
		delete(m.byHost, old.Value.(*cached).host)
	}
}

// mint makes host's leaf, signed by ca.
func (m *Minter) mint(ca *CA, host string, now time.Time) (*tls.Certificate, error) {
	if ca == nil {
		return nil, fmt.Errorf("no CA to sign %s's certificate with", host)
	}
	if now.After(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("%w: it expired %s", ErrCAExpired, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	validity := m.Validity
	if validity <= 0 {
		validity = DefaultLeafValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notBefore := now.Add(-leafBackdate)
	if notBefore.Before(ca.Cert.NotBefore) {
		notBefore = ca.Cert.NotBefore
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		// No common name: OpenSSL checks the common name of a leaf with no
		// DNS name as a DNS name against the CA's name constraints, so a
		// CA permitting 127.0.0.1 and no name would have its 127.0.0.1
		// leaf refused by curl, Python and Node.
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.Subject = pkix.Name{CommonName: host}
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing %s's certificate: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	m.minted.Add(1)
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}
