package testcert

import (
	"crypto/tls"
	"sync"
)

// LeafCache is a certificate store for goproxy's MITM (its CertStore, which
// goproxy leaves unset): a map, so that each host's leaf is signed once, as
// the sidecar's own minter does, and a benchmark compares the proxies
// rather than their signing. The zero value is ready to use.
type LeafCache struct {
	mu    sync.Mutex
	certs map[string]*tls.Certificate
}

// Fetch returns host's leaf, made by gen the first time it is asked for.
func (c *LeafCache) Fetch(host string, gen func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cert := c.certs[host]; cert != nil {
		return cert, nil
	}
	cert, err := gen()
	if err != nil {
		return nil, err
	}
	if c.certs == nil {
		c.certs = map[string]*tls.Certificate{}
	}
	c.certs[host] = cert
	return cert, nil
}
