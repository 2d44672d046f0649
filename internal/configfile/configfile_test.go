package configfile

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

type testFile struct {
	Name    *string          `yaml:"name"`
	Every   time.Duration    `yaml:"every"`
	Sub     *testSub         `yaml:"sub"`
	Items   []testSub        `yaml:"items"`
	Caps    map[string]int64 `yaml:"caps"`
	Loose   any              `yaml:"loose"`
	testTag `mapstructure:",squash"`
}

type testSub struct {
	A int    `yaml:"a"`
	B string `yaml:"b"`
}

type testTag struct {
	Old int `mapstructure:"old_style"`
}

func decodeText(t *testing.T, text string) (testFile, error) {
	t.Helper()
	var f testFile
	doc, err := Parse([]byte(text))
	if err != nil {
		return f, err
	}
	return f, doc.Decode(&f)
}

func TestDecode(t *testing.T) {
	f, err := decodeText(t, `
name: x
every: 0
sub: {a: 1, b: two}
items: [{a: 1}, ~, {<<: {a: 3, b: c}, b: d}]
caps: {x: 1, y: ~}
loose: {k: [1, 2]}
old_style: 4
`)
	if err != nil {
		t.Fatal(err)
	}
	if *f.Name != "x" || f.Every != 0 || f.Sub.A != 1 || f.Sub.B != "two" || len(f.Items) != 3 ||
		f.Items[2] != (testSub{A: 3, B: "d"}) || len(f.Caps) != 1 || f.Old != 4 || f.Loose == nil {
		t.Fatalf("%+v", f)
	}
	if f, err := decodeText(t, "# nothing\n"); err != nil || f.Name != nil {
		t.Fatalf("an empty document: %+v %v", f, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	for text, want := range map[string]string{
		"name: [unclosed":                    "config: (file): not valid YAML",
		"- a\n":                              "config: (file): line 1: is not a mapping of keys to values",
		"nme: x\n":                           "config: nme: line 1: unknown key; did you mean name?",
		"zzz: x\n":                           "config: zzz: line 1: unknown key (known here: caps, every, items, loose, name, old_style, sub)",
		"Old_Style: 1\n":                     "did you mean old_style?",
		"sub: 3\n":                           "config: sub: line 1: is not a mapping of keys to values",
		"items: {a: 1}\n":                    "config: items: line 1: is not a list",
		"items: [{a: x}]\n":                  "config: items[0].a: line 1: cannot unmarshal",
		"every: 5\n":                         "config: every: line 1: 5 is not a duration",
		"every: 1.5\n":                       "is not a duration",
		"every: soon\n":                      "config: every:",
		"caps: {a: 9223372036854775808}\n":   "config: caps.a: line 1: cannot unmarshal",
		"caps: {a: 2.5}\n":                   "config: caps.a: line 1: 2.5 is not a whole number",
		"sub: {a: 1e30}\n":                   "config: sub.a: line 1: 1e30 is out of range",
		"sub: {a: 1e400}\n":                  "config: sub.a: line 1: cannot unmarshal",
		"caps: [1]\n":                        "config: caps: line 1: is not a mapping",
		"sub: {<<: 3}\n":                     "config: sub: line 1: a merge key (<<) takes a mapping or a list of them",
		"sub: {<<: [{a: 1}, 2]}\n":           "takes a mapping or a list of them",
		"name: a\nname: b\n":                 "config: name: line 2: the key is given twice (first on line 1)",
		"sub: {a: 1, a: 2}\n":                "config: sub.a: line 1: the key is given twice (first on line 1)",
		"items: [{}, {b: x, b: y}]\n":        "config: items[1].b: line 1: the key is given twice",
		"x: &x {a: 1, a: 2}\nsub: *x\n":      "config: x.a: line 1: the key is given twice",
		"sub: {<<: {zz: 1}}\n":               "config: sub.zz: line 1: unknown key",
		"old_style: 1\nold_style: 2\n":       "config: old_style: line 2: the key is given twice",
		"name: !!binary aGVsbG8=\nsub: []\n": "config: sub: line 2: is not a mapping",
	} {
		_, err := decodeText(t, text)
		if err == nil || !strings.Contains(err.Error(), want) || !IsError(err) {
			t.Errorf("%q: %v, want a config error containing %q", text, err, want)
		}
	}
}

// Aliases are followed once each, so that a document that multiplies them
// (a "billion laughs") costs what its text does.
func TestManyAliases(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 {a: 1}\n")
	for i := 1; i < 40; i++ {
		fmt.Fprintf(&b, "a%d: &a%d {<<: [*a%d, *a%d], b: x}\n", i, i, i-1, i-1)
	}
	doc, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if doc.Lookup("a39") == nil || doc.Lookup("nope") != nil {
		t.Fatal("Lookup")
	}
}

func TestErrorText(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{Key: "a.b", Problem: "is bad"}, "config: a.b: is bad"},
		{Error{Problem: "is bad"}, "config: (file): is bad"},
		{Error{Key: "rules[1].class", Item: `rule "x"`, Problem: "is bad"}, `config: rules[1].class (rule "x"): is bad`},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%q, want %q", got, c.want)
		}
	}
}

func TestNearest(t *testing.T) {
	known := []string{"host", "port", "reap_interval", "listen", "http"}
	for s, want := range map[string]string{
		"hots": "host", "REAP_INTERVAL": "reap_interval", "reap_intervals": "reap_interval",
		"htp": "http", "lisen": "listen", "x": "", "colour": "", "pot": "port",
	} {
		if got := nearest(s, known); got != want {
			t.Errorf("nearest(%q) = %q, want %q", s, got, want)
		}
	}
}
