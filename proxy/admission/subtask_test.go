package admission

import (
	"strings"
	"testing"
)

func TestCheckSubtaskName(t *testing.T) {
	for _, tc := range []struct {
		name, want string // want: a part of the error, "" for none
	}{
		{"crawl-42", ""},
		{"crawl-ß-東京", ""},
		{"", ""},
		{strings.Repeat("a", MaxSubtaskName), ""},
		{strings.Repeat("a", MaxSubtaskName+1), "longer than 255 bytes"},
		{"bad\xff", "not valid UTF-8"},
		{"nul\x00", "control character U+0000"},
		{"crawl\x01", "control character U+0001"},
		{"a\tb", "control character U+0009"},
		{"line\nbreak", "control character U+000A"},
		{"del\x7f", "control character U+007F"},
		{"nel\u0085", "control character U+0085"},
	} {
		err := CheckSubtaskName(tc.name)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want no error", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
