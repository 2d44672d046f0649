package intercept

import (
	"os"
	"time"

	"github.com/governor-project/governor/internal/filepoll"
)

// Watcher keeps a Minter's CA current as its files change: a pair that
// loads as a CA valid now is put in force (leaves are then minted anew),
// one that does not is rejected and the CA in force stays. It polls the
// files by content, as the sidecar's other TLS files are polled, so a
// Kubernetes Secret's symlink swap is caught.
type Watcher struct {
	poller *filepoll.Poller
}

// Watch starts polling certFile and keyFile every interval; onReload, if
// not nil, is told of each change with the error that rejected it, if any.
// Close stops it.
func Watch(m *Minter, certFile, keyFile string, interval time.Duration, onReload func(error)) (*Watcher, error) {
	read := func() ([][]byte, error) {
		c, err := os.ReadFile(certFile)
		if err != nil {
			return nil, err
		}
		k, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, err
		}
		return [][]byte{c, k}, nil
	}
	current, err := read()
	if err != nil {
		return nil, err
	}
	apply := func(pair [][]byte, err error) {
		var ca *CA
		if err == nil {
			ca, err = ParseCA(pair[0], pair[1], m.now())
		}
		if err == nil {
			m.SetCA(ca)
		}
		if onReload != nil {
			onReload(err)
		}
	}
	return &Watcher{poller: filepoll.Start(interval, current, read, apply)}, nil
}

// Close stops watching, and waits until the polling has ended.
func (w *Watcher) Close() { w.poller.Close() }
