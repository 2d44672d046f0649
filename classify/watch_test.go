package classify

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Readiness is a signal: every test waits for the onReload callback, with a
// bound, and never sleeps a fixed time.
const reloadTimeout = 10 * time.Second

type reload struct {
	rules *Rules
	err   error
}

// watch starts a Watcher on path that polls every few milliseconds and
// reports each reload on the returned channel.
func watch(t *testing.T, path string) (*Watcher, chan reload) {
	t.Helper()
	ch := make(chan reload, 100)
	w, err := NewWatcher(path, func(r *Rules, err error) { ch <- reload{r, err} }, WithInterval(2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, ch
}

func next(t *testing.T, ch chan reload) reload {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(reloadTimeout):
		t.Fatalf("no reload within %v", reloadTimeout)
		return reload{}
	}
}

func ruleFile(names ...string) string {
	s := "http: {listen: 127.0.0.1:7700}\nrules:\n"
	for _, n := range names {
		s += fmt.Sprintf("  - {name: %s, match: {host: %s.test}, class: %s}\n", n, n, n)
	}
	return s
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	// Write beside and rename over, as most tools do; TestWatcherInPlace
	// covers writes in place.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func names(r *Rules) string { return fmt.Sprint(r.Names()) }

func TestWatcherReloadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	writeFile(t, path, ruleFile("a"))
	w, ch := watch(t, path)
	if got := names(w.Rules()); got != "[a]" {
		t.Fatalf("initial rules %s", got)
	}
	writeFile(t, path, ruleFile("a", "b"))
	r := next(t, ch)
	if r.err != nil || names(r.rules) != "[a b]" {
		t.Fatalf("reload: %s, %v", names(r.rules), r.err)
	}
	if got := names(w.Rules()); got != "[a b]" {
		t.Fatalf("Rules() = %s after the reload", got)
	}
	if d, ok := w.Rules().MatchHTTP(HTTPRequest{Host: "b.test", Method: "GET"}); !ok || d.Class != "b" {
		t.Fatalf("the new rule does not match: %v %v", d, ok)
	}
}

func TestWatcherInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	writeFile(t, path, ruleFile("a"))
	w, ch := watch(t, path)
	if err := os.WriteFile(path, []byte(ruleFile("c", "d", "e")), 0o600); err != nil {
		t.Fatal(err)
	}
	r := next(t, ch)
	if r.err != nil || names(r.rules) != "[c d e]" || names(w.Rules()) != "[c d e]" {
		t.Fatalf("reload: %s, %v", names(r.rules), r.err)
	}
}

func TestWatcherKeepsOldRulesOnBrokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	writeFile(t, path, ruleFile("a"))
	w, ch := watch(t, path)
	old := w.Rules()

	writeFile(t, path, ruleFile("a", "b")+"  - {name: bad, match: {method: FETCH}}\n")
	r := next(t, ch)
	var e *Error
	if !errors.As(r.err, &e) || e.Item != `rule "bad"` || e.Key != "rules[2].match.method" || r.rules != nil {
		t.Fatalf("reload: rules %v, error %v; want the validation error only", r.rules, r.err)
	}
	if w.Rules() != old {
		t.Fatalf("the rules changed to %s after a failed reload", names(w.Rules()))
	}

	// A broken file is reported once, not on every poll: the next report is
	// the fix.
	writeFile(t, path, ruleFile("x"))
	r = next(t, ch)
	if r.err != nil || names(w.Rules()) != "[x]" {
		t.Fatalf("after the fix: %v, rules %s", r.err, names(w.Rules()))
	}
	if len(ch) != 0 {
		t.Fatalf("%d more reports", len(ch))
	}
}

func TestWatcherMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	writeFile(t, path, ruleFile("a"))
	w, ch := watch(t, path)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	r := next(t, ch)
	if !errors.Is(r.err, os.ErrNotExist) || names(w.Rules()) != "[a]" {
		t.Fatalf("error %v, rules %s", r.err, names(w.Rules()))
	}
	writeFile(t, path, ruleFile("b"))
	if r = next(t, ch); r.err != nil || names(w.Rules()) != "[b]" {
		t.Fatalf("error %v, rules %s", r.err, names(w.Rules()))
	}
}

// A Kubernetes ConfigMap volume: proxy.yaml -> ..data/proxy.yaml, ..data ->
// ..data_v1. The kubelet writes ..data_v2, points a new symlink at it and
// renames that over ..data. The file's own path, size and mtime need not
// change; what it reads does.
func TestWatcherConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	v1, v2 := ruleFile("aaa"), ruleFile("bbb") // same size
	mkVersion := func(name, text string, mtime time.Time) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name, "proxy.yaml")
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	mtime := time.Now().Add(-time.Hour).Truncate(time.Second)
	mkVersion("..data_v1", v1, mtime)
	if err := os.Symlink("..data_v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "proxy.yaml")
	if err := os.Symlink(filepath.Join("..data", "proxy.yaml"), path); err != nil {
		t.Fatal(err)
	}
	w, ch := watch(t, path)
	if names(w.Rules()) != "[aaa]" {
		t.Fatalf("initial rules %s", names(w.Rules()))
	}

	mkVersion("..data_v2", v2, mtime)
	if err := os.Symlink("..data_v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..data_v1")); err != nil {
		t.Fatal(err)
	}
	r := next(t, ch)
	if r.err != nil || names(r.rules) != "[bbb]" || names(w.Rules()) != "[bbb]" {
		t.Fatalf("after the swap: %v, rules %s", r.err, names(w.Rules()))
	}
}

func TestWatcherExpandsEnv(t *testing.T) {
	t.Setenv("CLASSIFY_TEST_CLASS", "from-env")
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	writeFile(t, path, "task: {name: ${POD_NAME}}\nrules:\n  - {name: a, class: ${CLASSIFY_TEST_CLASS}}\n")
	w, _ := watch(t, path)
	if d := w.Rules().Decisions()[0]; d.Class != "from-env" {
		t.Fatalf("class %q", d.Class)
	}
}

func TestNewWatcherFails(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewWatcher(filepath.Join(dir, "none.yaml"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	path := filepath.Join(dir, "bad.yaml")
	writeFile(t, path, "rules: [{name: a, class: \"\"}]\n")
	var e *Error
	if _, err := NewWatcher(path, nil); !errors.As(err, &e) {
		t.Fatalf("bad file: %v", err)
	}
}

func TestWatcherClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	writeFile(t, path, ruleFile("a"))
	w, err := NewWatcher(path, nil) // the default interval: Close must not wait for a tick
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	w.Close()
	w.Close()
	if d := time.Since(start); d > DefaultInterval/2 {
		t.Errorf("Close took %v", d)
	}
	if names(w.Rules()) != "[a]" {
		t.Error("the rules are gone after Close")
	}
}

// Readers never block or see a torn value while reloads swap the rules.
func TestWatcherConcurrentReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	writeFile(t, path, ruleFile("r0"))
	w, ch := watch(t, path)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				rs := w.Rules()
				if rs.Len() == 0 {
					t.Error("empty rules")
					return
				}
				rs.MatchHTTP(HTTPRequest{Host: "r1.test", Method: "GET"})
			}
		}()
	}
	for i := 1; i <= 5; i++ {
		want := fmt.Sprintf("r%d", i)
		writeFile(t, path, ruleFile(want))
		if r := next(t, ch); r.err != nil || names(r.rules) != "["+want+"]" {
			t.Fatalf("reload %d: %v %s", i, r.err, names(r.rules))
		}
	}
	close(stop)
	wg.Wait()
}

// A file that loses its rules: list (a half-written file, a bad edit) keeps
// the rules in force; "rules: []" removes them on purpose.
func TestWatcherRefusesAFileWithoutRules(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "proxy.yaml")
	write := func(s string) {
		if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - name: llm\n    match: {host: api.openai.com}\n    class: llm\n")
	got := make(chan error, 4)
	w, err := NewWatcher(path, func(_ *Rules, err error) { got <- err }, WithInterval(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write("governor: {addr: 127.0.0.1:7600}\nrule:\n  - name: llm\n")
	select {
	case err := <-got:
		if err == nil || !strings.Contains(err.Error(), "no rules: list") {
			t.Fatalf("reload without rules: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload reported")
	}
	if w.Rules().Len() != 1 {
		t.Fatalf("%d rules in force after a file without rules, want the 1 kept", w.Rules().Len())
	}
	write("rules: []\n")
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload reported")
	}
	if w.Rules().Len() != 0 {
		t.Fatalf("%d rules after rules: [], want 0", w.Rules().Len())
	}
}

func TestWatcherValidatesTheWholeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte("rules: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 4)
	w, err := NewWatcher(path, func(_ *Rules, err error) { got <- err }, WithInterval(5*time.Millisecond),
		WithValidate(func(text []byte) error {
			if strings.Contains(string(text), "bogus") {
				return errors.New("bogus key")
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := os.WriteFile(path, []byte("bogus: 1\nrules:\n  - {name: a, class: x}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err == nil || !strings.Contains(err.Error(), "bogus key") {
			t.Fatalf("reload of an invalid file: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload reported")
	}
	if w.Rules().Len() != 0 {
		t.Fatal("an invalid file's rules were applied")
	}
}
