// Package tlsreload keeps a TLS certificate and its key current as their
// files change, with no restart and no dropped connection. A tls.Config
// whose GetCertificate (or GetClientCertificate) is a Reloader's hands each
// new handshake the newest pair; connections already open keep the one
// they were made with.
//
// The files are polled by content, through their paths (internal/filepoll,
// as classify's rule watcher polls the rules): that catches a file rewritten in place, a rename
// over it, and cert-manager's rotation of a Kubernetes Secret volume, where
// tls.crt and tls.key are symlinks into "..data", itself a symlink that the
// kubelet swaps to a new directory atomically (the files' own mtimes do not
// change then). A change is applied once the pair has read the same on two
// polls in a row, so a writer that replaces the certificate and then the
// key is not caught between the two. A pair that fails to load (unreadable,
// not PEM, a key that does not match the certificate) is rejected: the pair
// in force stays, and the failure is reported once.
//
// It may import only the standard library and internal/filepoll.
package tlsreload

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/internal/filepoll"
)

// DefaultInterval is how often a Reloader polls its files.
const DefaultInterval = time.Second

// Options configure New. The zero value polls every DefaultInterval and
// reports nothing.
type Options struct {
	// Interval is how often the files are polled; zero: DefaultInterval.
	Interval time.Duration
	// OnReload, if not nil, is called from the polling goroutine after a
	// change to the files: with the new certificate and a nil error when
	// the pair loaded and is now in force, or with nil and the error when
	// it failed (the pair in force stays). The caller logs and counts.
	OnReload func(*tls.Certificate, error)
}

// Reloader holds the certificate in force for one pair of files.
type Reloader struct {
	certFile, keyFile string
	opts              Options
	cert              atomic.Pointer[tls.Certificate]

	poller *filepoll.Poller
}

// New loads the pair now and starts watching the files. An error loading it
// now is returned, and nothing is started. Close stops the watching.
func New(certFile, keyFile string, opts Options) (*Reloader, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, opts: opts}
	pair, err := r.read()
	if err != nil {
		return nil, err
	}
	cert, err := load(pair[0], pair[1])
	if err != nil {
		return nil, err
	}
	r.cert.Store(cert)
	r.poller = filepoll.Start(opts.Interval, pair, r.read, r.apply)
	return r, nil
}

// Certificate returns the pair in force.
func (r *Reloader) Certificate() *tls.Certificate { return r.cert.Load() }

// GetCertificate is tls.Config's GetCertificate, for a server.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// GetClientCertificate is tls.Config's GetClientCertificate, for a client
// that presents a certificate.
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// Close stops watching and waits until the polling goroutine has ended. It
// may be called more than once; the pair in force stays usable.
func (r *Reloader) Close() { r.poller.Close() }

// apply puts a pair that changed in force, if it loads.
func (r *Reloader) apply(pair [][]byte, err error) {
	var cert *tls.Certificate
	if err == nil {
		cert, err = load(pair[0], pair[1])
	}
	if err == nil {
		r.cert.Store(cert)
	}
	if r.opts.OnReload != nil {
		r.opts.OnReload(cert, err)
	}
}

func (r *Reloader) read() ([][]byte, error) {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return nil, err
	}
	return [][]byte{certPEM, keyPEM}, nil
}

// load parses a pair. Its error names no key material.
func load(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the certificate and key do not load as a pair: %w", err)
	}
	if cert.Leaf == nil {
		return nil, errors.New("the certificate does not parse")
	}
	return &cert, nil
}
