package classify

import (
	"path"
	"strings"
	"testing"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		fold    bool
		yes, no []string
	}{
		{pattern: "abc", yes: []string{"abc"}, no: []string{"ABC", "ab", "abcd", ""}},
		{pattern: "abc", fold: true, yes: []string{"abc", "ABC", "aBc"}, no: []string{"ab"}},
		{pattern: "*.openai.com", fold: true, yes: []string{"api.openai.com", "A.B.OpenAI.com", ".openai.com"}, no: []string{"openai.com", "api.openai.com.evil", "apiXopenai.com"}},
		{pattern: "*", yes: []string{"", "x", "a/b/c"}},
		{pattern: "a*b*c", yes: []string{"abc", "aXbYc", "abbbc", "acbc"}, no: []string{"ab", "acb", "abcx"}},
		{pattern: "a?c", yes: []string{"abc", "aéc"}, no: []string{"ac", "abbc"}},
		{pattern: "[a-c]x", yes: []string{"ax", "cx"}, no: []string{"dx", "Ax", "x"}},
		{pattern: "[a-c]x", fold: true, yes: []string{"Ax", "CX"}, no: []string{"dx"}},
		{pattern: "[!a-c]x", yes: []string{"dx", "éx"}, no: []string{"ax", "x"}},
		{pattern: "[^0-9]*", yes: []string{"a1", "é"}, no: []string{"1a", ""}},
		{pattern: `\*lit\?`, yes: []string{"*lit?"}, no: []string{"xlitx"}},
		{pattern: "**", yes: []string{"", "any/thing"}},
		{pattern: "*a*a*a*a*a*a*b", yes: []string{strings.Repeat("a", 40) + "b"}, no: []string{strings.Repeat("a", 4000)}},
	} {
		g, err := compileGlob(tc.pattern, tc.fold)
		if err != nil {
			t.Fatalf("%q: %v", tc.pattern, err)
		}
		for _, s := range tc.yes {
			if !g.match(s) {
				t.Errorf("%q (fold %v) does not match %q", tc.pattern, tc.fold, s)
			}
		}
		for _, s := range tc.no {
			if g.match(s) {
				t.Errorf("%q (fold %v) matches %q", tc.pattern, tc.fold, s)
			}
		}
	}
}

func TestGlobErrors(t *testing.T) {
	for pattern, want := range map[string]string{
		"":       "is empty",
		"a[b":    "a [ is not closed",
		"a[]":    "a [] set is empty",
		"[z-a]":  "range z-a is reversed",
		`ab\`:    "ends with an escape",
		"[é]":    "ASCII",
		`[a\`:    "not closed",
		"[a-":    "not closed",
		"x[!]":   "empty",
		"[a-\\]": "reversed",
	} {
		if _, err := compileGlob(pattern, false); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %q", pattern, err, want)
		}
	}
}

// The glob agrees with path.Match, a second and independent
// implementation, wherever their syntax agrees (no "/" in the subject, as
// path.Match's "*" stops there).
func FuzzGlobAgainstPathMatch(f *testing.F) {
	for _, s := range [][2]string{{"a*b", "axxb"}, {"[a-c]?*", "b12"}, {"*x*y", "xxyy"}, {"\\*", "*"}, {"[^a]", "b"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		if strings.ContainsAny(pattern+s, "/!") || strings.Contains(pattern, "[]") || strings.Contains(pattern, "[!]") {
			return
		}
		want, err := path.Match(pattern, s)
		g, gerr := compileGlob(pattern, false)
		if err != nil || gerr != nil || !isASCII(pattern) || !isASCII(s) {
			return
		}
		if got := g.match(s); got != want {
			t.Fatalf("glob %q on %q: %v, path.Match says %v", pattern, s, got, want)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func TestPathPattern(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		yes, no []string
	}{
		{"/v1", []string{"/v1", "/v1/", "/v1/x/y"}, []string{"/v1beta", "/", "/v", "/x/v1"}},
		{"/v1/", []string{"/v1/", "/v1/x"}, []string{"/v1", "/v1beta/"}},
		{"/v1/*", []string{"/v1/", "/v1/x", "/v1/x/y"}, []string{"/v1", "/v2/x"}},
		{"/v1/*/c", []string{"/v1/a/c", "/v1//c", "/v1/a/c/d"}, []string{"/v1/a/b/c", "/v1/a/cd"}},
		{"/v1/**/c", []string{"/v1/c", "/v1/a/c", "/v1/a/b/c", "/v1/a/b/c/"}, []string{"/v1/a/b", "/v1"}},
		{"/**", []string{"/", "/a/b"}, nil},
		{"/**/x", []string{"/x", "/a/x", "/a/b/x/y"}, []string{"/a/y"}},
		{"/**/**/x", []string{"/x", "/a/x"}, []string{"/a"}},
		{"/", []string{"/", "/x", "/x/y/"}, []string{""}},
		{"/a*/b", []string{"/a/b", "/abc/b"}, []string{"/xa/b", "/a/x/b"}},
	} {
		p, err := compilePath(tc.pattern)
		if err != nil {
			t.Fatalf("%q: %v", tc.pattern, err)
		}
		for _, s := range tc.yes {
			if !p.match(s) {
				t.Errorf("%q does not match %q", tc.pattern, s)
			}
		}
		for _, s := range tc.no {
			if p.match(s) {
				t.Errorf("%q matches %q", tc.pattern, s)
			}
		}
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"/":             "/",
		"/a/b":          "/a/b",
		"/a/b/":         "/a/b/",
		"/a//b":         "/a/b",
		"/a/./b":        "/a/b",
		"/a/../b":       "/b",
		"/../../b":      "/b",
		"/a/..":         "/",
		"/a/.":          "/a",
		"/a/b/../":      "/a/",
		"/.well-known/": "/.well-known/",
		"/a/..b":        "/a/..b",
	} {
		if got := cleanPath(in); got != want {
			t.Errorf("cleanPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSplitHostPort(t *testing.T) {
	for in, want := range map[string][2]string{
		"a.test":       {"a.test", ""},
		"a.test:8080":  {"a.test", "8080"},
		"[::1]:443":    {"::1", "443"},
		"[::1]":        {"::1", ""},
		"::1":          {"::1", ""},
		"fe80::1%eth0": {"fe80::1%eth0", ""},
		"":             {"", ""},
	} {
		h, p := splitHostPort(in)
		if h != want[0] || p != want[1] {
			t.Errorf("splitHostPort(%q) = %q, %q; want %q, %q", in, h, p, want[0], want[1])
		}
	}
}
