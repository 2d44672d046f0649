package classify

import (
	"errors"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/governor-project/governor/internal/envsubst"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A testdata/valid_*.yaml file is a proxy config whose rules must load,
// plus test_http and test_sql keys (which Parse ignores, as it ignores every
// key but rules:) listing requests and the rule each must match.
type fileCases struct {
	HTTP []httpCase `yaml:"test_http"`
	SQL  []sqlCase  `yaml:"test_sql"`
}

type want struct {
	Rule             string           `yaml:"rule"` // "" for no match
	Class            *string          `yaml:"class"`
	Charge           map[string]int64 `yaml:"charge"`
	ChargeFromHeader string           `yaml:"charge_from_header"` // "resource Header"
}

type httpCase struct {
	Req    string            `yaml:"req"` // "METHOD URL", or "CONNECT host:port"
	Header map[string]string `yaml:"header"`
	want   `yaml:",inline"`
}

type sqlCase struct {
	Kinds           []string `yaml:"kinds"`
	Tables          []string `yaml:"tables"`
	Database        string   `yaml:"database"`
	User            string   `yaml:"user"`
	ApplicationName string   `yaml:"application_name"`
	want            `yaml:",inline"`
}

// request builds the *http.Request a forward proxy would receive.
func (c httpCase) request(t *testing.T) *http.Request {
	t.Helper()
	method, target, ok := strings.Cut(c.Req, " ")
	if !ok {
		t.Fatalf("bad req %q", c.Req)
	}
	r := &http.Request{Method: method, Header: http.Header{}}
	if strings.EqualFold(method, http.MethodConnect) {
		r.URL, r.Host = &url.URL{Host: target}, target
	} else {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatalf("bad req %q: %v", c.Req, err)
		}
		r.URL, r.Host = u, u.Host
	}
	for k, v := range c.Header {
		r.Header.Set(k, v)
	}
	return r
}

func TestValidFiles(t *testing.T) {
	t.Setenv("GOVERNOR_API_KEY", "k")
	t.Setenv("POD_NAME", "worker-1")
	files, _ := filepath.Glob("testdata/valid_*.yaml")
	if len(files) == 0 {
		t.Fatal("no testdata/valid_*.yaml")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			rules, err := Load(file)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			text, _ := os.ReadFile(file)
			var fc fileCases
			doc, _, err := envsubst.Parse(text)
			if err == nil {
				err = doc.Decode(&fc)
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(fc.HTTP)+len(fc.SQL) == 0 {
				t.Fatal("the file has no test_http or test_sql cases")
			}
			for _, c := range fc.HTTP {
				req := HTTPRequestFrom(c.request(t))
				d, ok := rules.MatchHTTP(req)
				check(t, c.Req, c.want, d, ok, rules.ExplainHTTP(req))
			}
			for _, c := range fc.SQL {
				st := SQLStatement{Kinds: c.Kinds, Tables: c.Tables, Database: c.Database,
					User: c.User, ApplicationName: c.ApplicationName}
				d, ok := rules.MatchSQL(st)
				check(t, strings.Join(c.Kinds, ",")+" "+strings.Join(c.Tables, ","), c.want, d, ok, rules.ExplainSQL(st))
			}
		})
	}
}

func check(t *testing.T, name string, w want, d Decision, ok bool, steps []Step) {
	t.Helper()
	if got := map[bool]string{true: d.Rule}[ok]; got != w.Rule {
		t.Errorf("%s: matched %q, want %q\nexplain:\n%s", name, got, w.Rule, stepsText(steps))
		return
	}
	// The explanation must agree with the match.
	if n := len(steps); ok && (n == 0 || !steps[n-1].Matched || steps[n-1].Rule != d.Rule) || !ok && n > 0 && steps[n-1].Matched {
		t.Errorf("%s: explanation disagrees with match %q:\n%s", name, d.Rule, stepsText(steps))
	}
	for _, s := range steps {
		if s.Reason == "" {
			t.Errorf("%s: step %q has no reason", name, s.Rule)
		}
	}
	if w.Class != nil && d.Class != *w.Class {
		t.Errorf("%s: class %q, want %q", name, d.Class, *w.Class)
	}
	if w.Charge != nil && !maps.Equal(d.Charges, w.Charge) {
		t.Errorf("%s: charges %v, want %v", name, d.Charges, w.Charge)
	}
	if w.ChargeFromHeader != "" {
		if c := d.ChargeFromHeader; c == nil || c.Resource+" "+c.Header != w.ChargeFromHeader {
			t.Errorf("%s: charge_from_header %+v, want %s", name, c, w.ChargeFromHeader)
		}
	}
}

func stepsText(steps []Step) string {
	var b strings.Builder
	for _, s := range steps {
		b.WriteString("  " + s.String() + "\n")
	}
	return b.String()
}

// A testdata/invalid_*.yaml file must be rejected whole, with an error that
// contains its want_error line (read as text: some of the files are not
// YAML at all).
func TestInvalidFiles(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid_*.yaml")
	if len(files) == 0 {
		t.Fatal("no testdata/invalid_*.yaml")
	}
	wantRe := regexp.MustCompile(`(?m)^want_error: '(.*)'$`)
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			text, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			m := wantRe.FindSubmatch(text)
			if m == nil {
				t.Fatal("the file has no want_error: '...' line")
			}
			rules, err := Parse(text)
			if err == nil {
				t.Fatalf("Parse accepted it (%d rules)", rules.Len())
			}
			if rules != nil {
				t.Errorf("Parse returned rules with its error")
			}
			if !strings.Contains(err.Error(), string(m[1])) {
				t.Errorf("error %q\ndoes not contain %q", err, m[1])
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %T is not an *Error", err)
			}
		})
	}
}

func TestParseEdges(t *testing.T) {
	for _, tc := range []struct {
		name, text, err string
		rules           int
	}{
		{name: "empty document", text: "", err: "the document is empty"},
		{name: "only a comment", text: "# nothing\n", err: "the document is empty"},
		{name: "not a mapping", text: "- a\n- b\n", err: "the document is not a mapping"},
		{name: "rules null", text: "rules:\n", rules: 0},
		{name: "rules empty", text: "rules: []\n", rules: 0},
		{name: "name as number", text: "rules: [{name: 7}]\n", rules: 1},
		{name: "long name", text: "rules: [{name: " + strings.Repeat("x", MaxNameLen+1) + "}]\n", err: "is longer than 256 bytes"},
		{name: "class bad", text: "rules: [{name: a, class: \"\\0\"}]\n", err: `rules[0].class (rule "a"): contains a NUL byte`},
		{name: "charge empty resource", text: "rules: [{name: a, charge: {\"\": 1}}]\n", err: `rules[0].charge (rule "a"): a resource name is empty`},
		{name: "sql any wins", text: "rules: [{name: a, match: {sql: [select, any]}}]\n", rules: 1},
		{name: "second document ignored", text: "rules: [{name: a}]\n---\nrules: 3\n", rules: 1},
		{name: "alias to non-list", text: "x: &x 3\nrules: *x\n", err: "rules: line 1: is not a list of rules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := Parse([]byte(tc.text))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rules.Len() != tc.rules {
				t.Fatalf("%d rules, want %d", rules.Len(), tc.rules)
			}
		})
	}
}

func TestErrorKey(t *testing.T) {
	_, err := Parse([]byte("rules:\n  - {name: a}\n  - {name: writes, match: {method: FETCH}}\n"))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%v is not an *Error", err)
	}
	if e.Key != "rules[1].match.method" || e.Item != `rule "writes"` {
		t.Fatalf("%+v", e)
	}
	if want := `config: rules[1].match.method (rule "writes"): "FETCH" is not an HTTP method`; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("%q does not start with %q", err, want)
	}
	for _, c := range []struct {
		text, key string
	}{
		{"rules: 3\n", "rules"},
		{"", "(file)"},
		{"rules: [3]\n", "rules[0]"},
	} {
		_, err := Parse([]byte(c.text))
		if !errors.As(err, &e) || e.Key != c.key {
			t.Errorf("%q: %v, want an error on key %q", c.text, err, c.key)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("error %v, want one wrapping os.ErrNotExist", err)
	}
}

func TestLoadTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, make([]byte, MaxFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("error %v", err)
	}
}

func TestDecisionString(t *testing.T) {
	rules, err := Parse([]byte(`rules:
  - name: llm
    class: llm
    charge: {llm_calls: 1, budget: 5}
    charge_from_header: {resource: tokens, header: x-usage-tokens}
  - {name: bare}
`))
	if err != nil {
		t.Fatal(err)
	}
	ds := rules.Decisions()
	if got, want := ds[0].String(), `rule "llm": class llm; charge budget=5, llm_calls=1; after the response, charge tokens from header X-Usage-Tokens`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if got, want := ds[1].String(), `rule "bare": no lease; no charge`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if got := rules.Names(); strings.Join(got, ",") != "llm,bare" {
		t.Errorf("Names %v", got)
	}
}

func TestHeaderChargeAmount(t *testing.T) {
	c := &HeaderCharge{Resource: "tokens", Header: "X-Usage-Tokens"}
	for _, tc := range []struct {
		values []string
		want   int64
		err    error
	}{
		{values: []string{"1234"}, want: 1234},
		{values: []string{" 7 "}, want: 7},
		{values: []string{"0"}, want: 0},
		{values: []string{"5", "9"}, want: 5},
		{values: nil, err: ErrHeaderMissing},
		{values: []string{""}, err: ErrHeaderNotNumber},
		{values: []string{"12.5"}, err: ErrHeaderNotNumber},
		{values: []string{"-3"}, err: ErrHeaderNotNumber},
		{values: []string{"lots"}, err: ErrHeaderNotNumber},
		{values: []string{"99999999999999999999"}, err: ErrHeaderNotNumber},
	} {
		h := http.Header{}
		for _, v := range tc.values {
			h.Add("x-usage-tokens", v)
		}
		got, err := c.Amount(h)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("%q: got %d, %v; want %d, %v", tc.values, got, err, tc.want, tc.err)
		}
	}
}

func TestExplainReasons(t *testing.T) {
	rules, err := Parse([]byte(`rules:
  - {name: sql, match: {sql: insert, tables: [pay*]}}
  - {name: host, match: {host: "*.openai.com"}}
  - {name: port, match: {port: 8443}}
  - {name: scheme, match: {scheme: http}}
  - {name: method, match: {method: [POST, PUT]}}
  - {name: path, match: {path: /v1/}}
  - {name: header, match: {header: {x-team: a*}}}
  - {name: all, match: {}}
`))
	if err != nil {
		t.Fatal(err)
	}
	steps := rules.ExplainHTTP(HTTPRequest{Scheme: "https", Host: "example.com", Method: "GET", Path: "/v2"})
	want := []string{
		`sql: no match: a SQL rule (it has sql, tables); never matches HTTP`,
		`host: no match: match.host: "example.com" does not match "*.openai.com"`,
		`port: no match: match.port: 443 is not 8443`,
		`scheme: no match: match.scheme: "https" is not http`,
		`method: no match: match.method: "GET" is not POST or PUT`,
		`path: no match: match.path: "/v2" does not match "/v1/"`,
		`header: no match: match.header: X-Team is missing`,
		`all: MATCH: its match is empty, so it matches everything`,
	}
	if got := stepsText(steps); got != "  "+strings.Join(want, "\n  ")+"\n" {
		t.Errorf("got:\n%swant:\n  %s", got, strings.Join(want, "\n  "))
	}
	steps = rules.ExplainSQL(SQLStatement{Kinds: []string{"select"}, Tables: []string{"payments"}})
	if got := steps[0].String(); got != `sql: no match: match.sql: [select] shares no kind with [insert]` {
		t.Errorf("got %s", got)
	}
	steps = rules.ExplainSQL(SQLStatement{Kinds: []string{"insert"}, Tables: []string{"ledger"}})
	if got := steps[0].String(); got != `sql: no match: match.tables: no table of [ledger] matches pay*` {
		t.Errorf("got %s", got)
	}
	steps = rules.ExplainSQL(SQLStatement{Kinds: []string{"insert"}, Tables: []string{"payments"}})
	if len(steps) != 1 || !steps[0].Matched || steps[0].Reason != "every field matches: sql, tables" {
		t.Errorf("got %v", steps)
	}
	if got := rules.ExplainSQL(SQLStatement{})[1].String(); got != `host: no match: an HTTP rule (it has host); never matches SQL` {
		t.Errorf("got %s", got)
	}
}

func TestNilRules(t *testing.T) {
	var rs *Rules
	if _, ok := rs.MatchHTTP(HTTPRequest{Host: "x"}); ok {
		t.Error("nil rules matched HTTP")
	}
	if _, ok := rs.MatchSQL(SQLStatement{}); ok {
		t.Error("nil rules matched SQL")
	}
	if rs.Len() != 0 || rs.Names() != nil || rs.ExplainHTTP(HTTPRequest{}) != nil {
		t.Error("nil rules are not empty")
	}
}

// Matching must not allocate, so that classification costs nothing on the
// proxy's hot path.
func TestMatchDoesNotAllocate(t *testing.T) {
	rules := benchRules(t)
	req := benchRequest()
	if n := testing.AllocsPerRun(200, func() { rules.MatchHTTP(req) }); n != 0 {
		t.Errorf("MatchHTTP: %v allocations per run", n)
	}
	miss := req
	miss.Host = "nowhere.test"
	if n := testing.AllocsPerRun(200, func() { rules.MatchHTTP(miss) }); n != 0 {
		t.Errorf("MatchHTTP with no match: %v allocations per run", n)
	}
	st := SQLStatement{Kinds: []string{"insert"}, Tables: []string{"public.payments"}, Database: "app", User: "svc"}
	if n := testing.AllocsPerRun(200, func() { rules.MatchSQL(st) }); n != 0 {
		t.Errorf("MatchSQL: %v allocations per run", n)
	}
}
