// Package tlsreload keeps a TLS certificate and its key current as their
// files change, with no restart and no dropped connection. A tls.Config
// whose GetCertificate (or GetClientCertificate) is a Reloader's hands each
// new handshake the newest pair; connections already open keep the one
// they were made with.
//
// The files are polled by content, through their paths, as classify's rule
// watcher polls the rules: that catches a file rewritten in place, a rename
// over it, and cert-manager's rotation of a Kubernetes Secret volume, where
// tls.crt and tls.key are symlinks into "..data", itself a symlink that the
// kubelet swaps to a new directory atomically (the files' own mtimes do not
// change then). A change is applied once the pair has read the same on two
// polls in a row, so a writer that replaces the certificate and then the
// key is not caught between the two. A pair that fails to load (unreadable,
// not PEM, a key that does not match the certificate) is rejected: the pair
// in force stays, and the failure is reported once.
//
// It may import only the standard library.
package tlsreload

import (
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
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

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	// Owned by the polling goroutine.
	handled [sha256.Size]byte // the content last applied or reported
	pending [sha256.Size]byte // content seen once, waiting for a second look
	waiting bool
}

// New loads the pair now and starts watching the files. An error loading it
// now is returned, and nothing is started. Close stops the watching.
func New(certFile, keyFile string, opts Options) (*Reloader, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, opts: opts, stop: make(chan struct{}), done: make(chan struct{})}
	certPEM, keyPEM, err := r.read()
	if err != nil {
		return nil, err
	}
	cert, err := load(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	r.cert.Store(cert)
	r.handled = digest(certPEM, keyPEM)
	go r.run()
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
func (r *Reloader) Close() {
	r.closeOnce.Do(func() { close(r.stop) })
	<-r.done
}

func (r *Reloader) run() {
	defer close(r.done)
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.poll()
		}
	}
}

// poll reads the files once and acts on a change that has settled.
func (r *Reloader) poll() {
	certPEM, keyPEM, readErr := r.read()
	key := digest(certPEM, keyPEM)
	if readErr != nil {
		// Unreadable is an observation too: reported once, and only if it
		// lasts two polls (a rename over a file can leave it briefly
		// missing).
		key = sha256.Sum256([]byte("\x00read error\x00" + readErr.Error()))
	}
	if key == r.handled {
		r.waiting = false
		return
	}
	if !r.waiting || key != r.pending {
		r.pending, r.waiting = key, true
		return
	}
	r.handled, r.waiting = key, false
	err := readErr
	var cert *tls.Certificate
	if err == nil {
		cert, err = load(certPEM, keyPEM)
	}
	if err == nil {
		r.cert.Store(cert)
	}
	if r.opts.OnReload != nil {
		r.opts.OnReload(cert, err)
	}
}

func (r *Reloader) read() (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(r.certFile); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = os.ReadFile(r.keyFile); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
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

func digest(certPEM, keyPEM []byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write(certPEM)
	h.Write([]byte{0})
	h.Write(keyPEM)
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}
