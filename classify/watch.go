package classify

import (
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/internal/filepoll"
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

	poller *filepoll.Poller
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
	w := &Watcher{path: path, interval: DefaultInterval, onReload: onReload}
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
	w.poller = filepoll.Start(w.interval, [][]byte{text}, w.read, w.apply)
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
	w.poller.Close()
	return nil
}

func (w *Watcher) read() ([][]byte, error) {
	text, err := readFile(w.path)
	return [][]byte{text}, err
}

// apply puts a file that changed in force, if its rules load.
func (w *Watcher) apply(file [][]byte, readErr error) {
	if readErr != nil {
		w.report(nil, readErr)
		return
	}
	text := file[0]
	rules, listed, err := parse(text)
	if err == nil && !listed {
		// A file that lost its rules: list (a half-written one, a bad edit)
		// must not turn every rule off; removing them all takes "rules: []".
		err = &Error{Key: "rules", Problem: "the file has no rules: list; the rules in force stay (write \"rules: []\" to remove them all)"}
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
