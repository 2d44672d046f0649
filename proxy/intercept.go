package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/governor-project/governor/internal/tlsreload"
	"github.com/governor-project/governor/proxy/intercept"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// startInterception loads http.intercept's CA, checks it can sign now, and
// starts watching its files; a CA that cannot sign is a *ConfigError
// naming the key. It returns nil when nothing is intercepted.
func (s *Sidecar) startInterception() (*intercept.Interceptor, error) {
	ic := s.cfg.HTTP.Intercept
	if !ic.On() {
		return nil, nil
	}
	ca, err := intercept.LoadCA(ic.CACert, ic.CAKey, time.Now())
	if err != nil {
		return nil, &proxyconfig.ConfigError{Key: caKeyOf(err), Problem: err.Error()}
	}
	m := intercept.NewMinter(ca)
	m.MaxLeaves = ic.MaxLeaves
	interval := s.reloadInterval
	if interval <= 0 {
		interval = tlsreload.DefaultInterval
	}
	w, err := intercept.Watch(m, ic.CACert, ic.CAKey, interval, func(err error) {
		if err != nil {
			s.tlsReloads.WithLabelValues("failure").Inc()
			s.log.Error("governor-proxy: the interception CA failed to load; the one in force stays",
				"ca_cert", ic.CACert, "ca_key", ic.CAKey, "err", err)
			return
		}
		s.tlsReloads.WithLabelValues("success").Inc()
		c := m.CA().Cert
		s.log.Info("governor-proxy: interception CA reloaded; leaves are minted anew", "ca_cert", ic.CACert,
			"subject", c.Subject.String(), "not_after", c.NotAfter)
	})
	if err != nil {
		return nil, &proxyconfig.ConfigError{Key: "http.intercept.ca_cert", Problem: err.Error()}
	}
	s.caWatcher = w
	s.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "governor_proxy_intercept_leaves",
			Help: "Leaf certificates of intercepted hosts kept now (http.intercept.max_leaves bounds them)."},
			func() float64 { return float64(m.Cached()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "governor_proxy_intercept_leaves_minted_total",
			Help: "Leaf certificates minted for intercepted hosts: once per host, again before one expires or after the CA changes."},
			func() float64 { return float64(m.Minted()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "governor_proxy_intercept_ca_expiry_timestamp_seconds",
			Help: "When the interception CA in force expires, as a Unix time."},
			func() float64 { return float64(m.CA().Cert.NotAfter.Unix()) }),
	)
	if len(ca.Cert.PermittedDNSDomains)+len(ca.Cert.PermittedIPRanges) > 0 {
		for _, h := range ic.Hosts.Patterns() {
			if leaf, err := m.Leaf(h); err == nil && verifyLeaf(ca, leaf, h) != nil {
				s.log.Warn("governor-proxy: the CA's name constraints do not cover an intercepted host: clients will refuse it",
					"host", h, "ca_cert", ic.CACert)
			}
		}
	}
	return &intercept.Interceptor{Hosts: ic.Hosts, Minter: m}, nil
}

// caKeyOf names the key a CA that did not load is the fault of.
func caKeyOf(err error) string {
	if errors.Is(err, intercept.ErrKeyMismatch) || errors.Is(err, intercept.ErrBadKey) {
		return "http.intercept.ca_key"
	}
	return "http.intercept.ca_cert"
}

// verifyLeaf checks a minted leaf against its CA alone, name constraints
// included, as a client trusting the CA would.
func verifyLeaf(ca *intercept.CA, leaf *tls.Certificate, host string) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host})
	return err
}

// upstreamRoots is the TLS configuration of HTTP upstreams once
// http.intercept.upstream_ca_file adds its roots: the system's roots (or
// the ones base trusts) and the file's.
func upstreamRoots(base *tls.Config, caFile string) (*tls.Config, error) {
	if caFile == "" {
		return base, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, &proxyconfig.ConfigError{Key: "http.intercept.upstream_ca_file", Problem: err.Error()}
	}
	var c *tls.Config
	var pool *x509.CertPool
	if base != nil && base.RootCAs != nil {
		c = base.Clone()
		pool = base.RootCAs.Clone()
	} else {
		if base != nil {
			c = base.Clone()
		} else {
			c = &tls.Config{}
		}
		if pool, err = x509.SystemCertPool(); err != nil {
			pool = x509.NewCertPool()
		}
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, &proxyconfig.ConfigError{Key: "http.intercept.upstream_ca_file", Problem: caFile + " holds no PEM certificate"}
	}
	c.RootCAs = pool
	return c, nil
}
