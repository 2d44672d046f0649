package classify

import (
	"crypto/sha256"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often a Watcher polls its file.
const DefaultInterval = time.Second

// Watcher keeps the rules of one file current. It polls the file by content
// hash: every interval it reads the file through its path, so that whatever
// the path resolves to now is what counts. That catches an edit in place, a
// rename over the file, and a Kubernetes ConfigMap update, where the mounted
// file is a symlink into "..data", itself a symlink to a timestamped
// directory that the kubelet swaps atomically; the file's own mtime does not
// change then, but what the path reads does.
//
// A change is applied once the file has read the same on two polls in a row,
// so an editor that writes in place is not caught halfway. A file that fails
// to load (unreadable, bad YAML, a rule that fails validation) changes
// nothing: the rules in force stay, and the error is reported once for that
// content.
type Watcher struct {
	path     string
	interval time.Duration
	onReload func(*Rules, error)
	validate func(text []byte) error

	rules atomic.Pointer[Rules]

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	// Owned by the polling goroutine.
	handled [sha256.Size]byte // the content last applied or reported
	pending [sha256.Size]byte // content seen once, waiting for a second look
	waiting bool
}

// A WatchOption configures NewWatcher.
type WatchOption func(*Watcher)

// WithValidate checks the whole changed file (as read, before ${VAR}
// expansion) before its rules are applied; an error rejects the reload. A
// proxy passes its full config parser, so a file that would not start the
// proxy does not reload it either.
func WithValidate(f func(text []byte) error) WatchOption {
	return func(w *Watcher) { w.validate = f }
}

// WithInterval sets how often the file is polled (default DefaultInterval).
func WithInterval(d time.Duration) WatchOption {
	return func(w *Watcher) {
		if d > 0 {
			w.interval = d
		}
	}
}

// NewWatcher loads the rules at path as Load does and starts watching the
// file. An error loading it now is returned and nothing is started.
//
// After each later reload, onReload (which may be nil) is called from the
// watcher's goroutine: with the new rules and a nil error when the file
// changed and loaded, or with nil rules and the error when it failed, in
// which case Rules still returns the rules in force. The caller counts and
// logs both. onReload must not call Close.
func NewWatcher(path string, onReload func(*Rules, error), opts ...WatchOption) (*Watcher, error) {
	w := &Watcher{path: path, interval: DefaultInterval, onReload: onReload,
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		o(w)
	}
	text, err := readFile(path)
	if err != nil {
		return nil, err
	}
	rules, err := Parse(text)
	if err != nil {
		return nil, err
	}
	w.rules.Store(rules)
	w.handled = sha256.Sum256(text)
	go w.run()
	return w, nil
}

// Rules returns the rules in force. It never blocks and is safe from any
// goroutine; hold on to the result for the length of one request or
// transaction, so that it is classified by one rule set throughout.
func (w *Watcher) Rules() *Rules { return w.rules.Load() }

// Path returns the file being watched.
func (w *Watcher) Path() string { return w.path }

// Close stops watching and waits until the polling goroutine has ended. It
// may be called more than once. The last rules stay readable.
func (w *Watcher) Close() error {
	w.closeOnce.Do(func() { close(w.stop) })
	<-w.done
	return nil
}

func (w *Watcher) run() {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.poll()
		}
	}
}

// poll reads the file once and acts on a change that has settled.
func (w *Watcher) poll() {
	text, readErr := readFile(w.path)
	var key [sha256.Size]byte
	if readErr != nil {
		// An unreadable file is an observation too: reported once, not on
		// every poll, and only if it persists for two polls (a rename over
		// the file can leave it briefly missing).
		key = sha256.Sum256([]byte("\x00read error\x00" + readErr.Error()))
	} else {
		key = sha256.Sum256(text)
	}
	if key == w.handled {
		w.waiting = false
		return
	}
	if !w.waiting || key != w.pending {
		w.pending, w.waiting = key, true
		return
	}
	w.handled, w.waiting = key, false
	if readErr != nil {
		w.report(nil, readErr)
		return
	}
	rules, listed, err := parse(text)
	if err == nil && !listed {
		// A file that lost its rules: list (a half-written one, a bad edit)
		// must not turn every rule off; removing them all takes "rules: []".
		err = &Error{Index: -1, Field: "rules", Problem: "the file has no rules: list; the rules in force stay (write \"rules: []\" to remove them all)"}
	}
	if err == nil && w.validate != nil {
		err = w.validate(text)
	}
	if err != nil {
		w.report(nil, err)
		return
	}
	w.rules.Store(rules)
	w.report(rules, nil)
}

func (w *Watcher) report(r *Rules, err error) {
	if w.onReload != nil {
		w.onReload(r, err)
	}
}
