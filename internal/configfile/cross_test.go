package configfile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/internal/configfile"
	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"
)

// A testdata/*.yaml file is one case run through all three configs:
// governord's, the sidecar's and the rules. Each names the text, and either
// the error it must give (the key and what the message says) or values of
// the loaded config that must hold: a field path of the runtime Config
// (governord, proxy) or a rule's class and charges (rules).
type crossCase struct {
	Governord, Proxy, Rules crossText
}

type crossText struct {
	YAML  string            `yaml:"yaml"`
	Error *crossError       `yaml:"error"`
	Want  map[string]string `yaml:"want"`
}

type crossError struct {
	Key  string `yaml:"key"`
	Says string `yaml:"says"`
}

// The loaders, each giving what want: paths are looked up in.
var crossLoaders = []struct {
	name string
	text func(crossCase) crossText
	load func(text []byte) (any, error)
}{
	{"governord", func(c crossCase) crossText { return c.Governord }, func(text []byte) (any, error) {
		return serverconfig.ParseConfig(text)
	}},
	{"proxy", func(c crossCase) crossText { return c.Proxy }, func(text []byte) (any, error) {
		return proxyconfig.ParseConfig(text)
	}},
	{"rules", func(c crossCase) crossText { return c.Rules }, func(text []byte) (any, error) {
		rs, err := classify.Parse(text)
		if err != nil {
			return nil, err
		}
		byName := map[string]any{}
		for _, d := range rs.Decisions() {
			byName[d.Rule] = fmt.Sprintf("class=%s charges=%v", d.Class, d.Charges)
		}
		return byName, nil
	}},
}

// TestSameRulesInEveryConfig covers what the three loaders disagreed on
// (issue 28): null values, merge keys (across files and inside the
// sidecar's), key case and duplicate keys, and a few values beside.
func TestSameRulesInEveryConfig(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.yaml")
	if len(files) == 0 {
		t.Fatal("no testdata/*.yaml")
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var c crossCase
		if err := yaml.Unmarshal(raw, &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, l := range crossLoaders {
			t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml")+"/"+l.name, func(t *testing.T) {
				ct := l.text(c)
				if ct.YAML == "" || (ct.Error == nil) == (ct.Want == nil) {
					t.Fatalf("%s has no %s: with yaml and either error or want", file, l.name)
				}
				got, err := l.load([]byte(ct.YAML))
				if ct.Error != nil {
					checkError(t, err, ct.Error)
					return
				}
				if err != nil {
					t.Fatalf("%v", err)
				}
				for path, want := range ct.Want {
					if v := lookup(t, got, path); v != want {
						t.Errorf("%s = %q, want %q", path, v, want)
					}
				}
			})
		}
	}
}

func checkError(t *testing.T, err error, want *crossError) {
	t.Helper()
	var e *configfile.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want a *configfile.Error", err, err)
	}
	if e.Key != want.Key || !strings.Contains(e.Problem, want.Says) {
		t.Fatalf("error %q (key %q), want key %q saying %q", err, e.Key, want.Key, want.Says)
	}
	if !strings.Contains(err.Error(), want.Key) {
		t.Fatalf("error %q does not name the key %q", err, want.Key)
	}
}

var step = regexp.MustCompile(`^([A-Za-z]+)(?:\[([0-9]+)\])?$`)

// lookup follows path (Field.Field[2].Field, or a map's key) through v and
// prints what it finds.
func lookup(t *testing.T, v any, path string) string {
	t.Helper()
	if m, ok := v.(map[string]any); ok {
		return fmt.Sprint(m[path])
	}
	rv := reflect.ValueOf(v)
	for _, part := range strings.Split(path, ".") {
		m := step.FindStringSubmatch(part)
		for rv.Kind() == reflect.Pointer {
			rv = rv.Elem()
		}
		if m == nil || rv.Kind() != reflect.Struct {
			t.Fatalf("bad path %q at %q", path, part)
		}
		rv = rv.FieldByName(m[1])
		if !rv.IsValid() {
			t.Fatalf("bad path %q: no field %s", path, m[1])
		}
		if m[2] != "" {
			i, _ := strconv.Atoi(m[2])
			if i >= rv.Len() {
				t.Fatalf("%s: %s has %d items", path, m[1], rv.Len())
			}
			rv = rv.Index(i)
		}
	}
	return fmt.Sprint(rv.Interface())
}
