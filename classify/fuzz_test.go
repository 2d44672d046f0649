package classify

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that Parse never panics, and that whatever it accepts
// can be matched and explained without panicking either. Seeds: every
// testdata/*.yaml file, plus the corpus in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(text)
	}
	reqs := []HTTPRequest{
		{Scheme: "https", Host: "api.openai.com", Method: "POST", Path: "/v1/chat/completions", Header: http.Header{"X-Tenant": {"team-a"}}},
		{Host: "[::1]:8443", Method: "CONNECT"},
		{Scheme: "http", Host: "a.test", Method: "get", Path: "/a//b/../c/"},
		{},
	}
	stmts := []SQLStatement{
		{Kinds: []string{"insert", "select"}, Tables: []string{"public.payments", "ledger"}, Database: "app", User: "u", ApplicationName: "batch-1"},
		{},
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		rules, err := Parse(text)
		if err != nil {
			if rules != nil {
				t.Fatalf("rules and an error: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		for _, r := range reqs {
			d, ok := rules.MatchHTTP(r)
			steps := rules.ExplainHTTP(r)
			if ok != (len(steps) > 0 && steps[len(steps)-1].Matched) {
				t.Fatalf("MatchHTTP says %v (%q), ExplainHTTP %v", ok, d.Rule, steps)
			}
			_ = d.String()
		}
		for _, s := range stmts {
			d, ok := rules.MatchSQL(s)
			steps := rules.ExplainSQL(s)
			if ok != (len(steps) > 0 && steps[len(steps)-1].Matched) {
				t.Fatalf("MatchSQL says %v (%q), ExplainSQL %v", ok, d.Rule, steps)
			}
		}
	})
}
