package meter

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// An output limit is read only as a whole number from 0 to MaxOutputLimit;
// anything else is refused naming the field and the problem, so that no
// estimate can wrap around past int64's end.
func TestReadRequestRefusesHostileOutputLimits(t *testing.T) {
	for _, tc := range []struct {
		body    string
		max     int64
		field   string
		problem string
	}{
		{`{"max_tokens":0}`, 0, "", ""},
		{`{"max_tokens":null}`, 0, "", ""},
		{`{"max_tokens":2147483648}`, 0, "max_tokens", "over 16777216"},
		{`{"max_tokens":9007199254740992}`, 0, "max_tokens", "over 16777216"},
		{`{"max_tokens":9223372036854775807}`, 0, "max_tokens", "over 16777216"},
		{`{"max_tokens":92233720368547758070}`, 0, "max_tokens", "over 16777216"},
		{`{"max_completion_tokens":-1}`, 0, "max_completion_tokens", "negative"},
		{`{"max_output_tokens":-92233720368547758070}`, 0, "max_output_tokens", "negative"},
		{`{"max_tokens":1e30}`, 0, "max_tokens", "not an integer"},
		{`{"max_tokens":500.5}`, 0, "max_tokens", "not an integer"},
		{`{"max_tokens":"abc"}`, 0, "max_tokens", "not a number"},
		{`{"max_tokens":"100"}`, 0, "max_tokens", "not a number"},
		{`{"max_tokens":true}`, 0, "max_tokens", "not a number"},
		{`{"max_tokens":[1]}`, 0, "max_tokens", "not a number"},
		{`{"max_tokens":16777216}`, MaxOutputLimit, "", ""},
		{`{"max_tokens":16777217}`, 0, "max_tokens", "over 16777216"},
		{`{"max_tokens":10,"max_output_tokens":20}`, 20, "", ""},
	} {
		r, err := ReadRequest([]byte(tc.body))
		if tc.field == "" {
			if err != nil || r.MaxOutput != tc.max {
				t.Errorf("%s: %+v %v, want an output limit of %d", tc.body, r, err, tc.max)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Problem, tc.problem) {
			t.Errorf("%s: %v, want %s refused as %q", tc.body, err, tc.field, tc.problem)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, tc.field+" is ") {
			t.Errorf("%s: %q does not name the field first", tc.body, msg)
		}
	}
}

// Estimate saturates rather than wraps, whatever it is given.
func TestEstimateNeverWraps(t *testing.T) {
	for _, tc := range []struct {
		out       int64
		bodyLen   int
		bpt       int
		def, want int64
	}{
		{math.MaxInt64, 10, 1, 0, math.MaxInt64},
		{math.MaxInt64 - 5, 10, 1, 0, math.MaxInt64},
		{0, math.MaxInt, 1, math.MaxInt64, math.MaxInt64},
		{0, -1, 1, -5, 0},
		{1 << 53, 1 << 20, 4, 0, 1<<53 + 1<<18},
	} {
		if got := Estimate(Request{MaxOutput: tc.out}, tc.bodyLen, tc.bpt, tc.def); got != tc.want {
			t.Errorf("Estimate(%d, %d, %d, %d) = %d, want %d", tc.out, tc.bodyLen, tc.bpt, tc.def, got, tc.want)
		}
	}
	if got := (Usage{Input: math.MaxInt64, Output: 1, CacheRead: math.MaxInt64}).Tokens(Anthropic); got != math.MaxInt64 {
		t.Errorf("an Anthropic usage past int64's end: %d tokens", got)
	}
	if got := (Usage{Input: math.MaxInt64, Output: math.MaxInt64}).Tokens(OpenAI); got != math.MaxInt64 {
		t.Errorf("an OpenAI usage past int64's end: %d tokens", got)
	}
}

// FuzzEstimate: whatever a body says, what is reserved for it is at least
// what it asks for and never negative, and a body whose output limit is
// read reserves at most that limit plus its length.
func FuzzEstimate(f *testing.F) {
	for _, s := range []string{
		`{"max_tokens":100}`, `{"max_tokens":9223372036854775807}`, `{"max_tokens":-9223372036854775808}`,
		`{"max_completion_tokens":1e30}`, `{"max_output_tokens":"5"}`, `{"max_tokens":16777216,"stream":true}`,
		`{"max_tokens":2147483648}`, `{"max_tokens":9007199254740993}`, `[1]`, ``, `{"max_tokens":0.0}`,
	} {
		f.Add([]byte(s), 4, int64(4096))
	}
	f.Fuzz(func(t *testing.T, body []byte, bytesPerToken int, def int64) {
		r, err := ReadRequest(body)
		if err != nil {
			return
		}
		if r.MaxOutput < 0 || r.MaxOutput > MaxOutputLimit {
			t.Fatalf("%q: an output limit of %d was read", body, r.MaxOutput)
		}
		e := Estimate(r, len(body), bytesPerToken, def)
		if e < 0 {
			t.Fatalf("%q (bytes a token %d, default %d): estimate %d", body, bytesPerToken, def, e)
		}
		if r.MaxOutput > 0 && e > r.MaxOutput+int64(len(body)) {
			t.Fatalf("%q: estimate %d is over the limit %d plus the body's %d bytes", body, e, r.MaxOutput, len(body))
		}
		if r.MaxOutput > 0 && e < r.MaxOutput {
			t.Fatalf("%q: estimate %d is under the output limit %d", body, e, r.MaxOutput)
		}
	})
}

// usageNull cuts "usage": null with exactly the separator that goes with
// it, however the JSON is spaced, and nothing that is not it.
func TestUsageNullCut(t *testing.T) {
	for in, want := range map[string]string{
		`data: {"a":1,"usage":null}`:            `data: {"a":1}`,
		`data: {"a": 1, "usage": null}`:         `data: {"a": 1}`,
		`data: {"a": 1,  "usage" :	null }`:      `data: {"a": 1 }`,
		`data: {"usage": null, "a": 1}`:         `data: {"a": 1}`,
		`data: {"usage":null,"a":1}`:            `data: {"a":1}`,
		`data: {"a":1,"usage":{"total":3}}`:     ``,
		`data: {"a":1,"usage":nullx}`:           ``,
		`data: {"a":"usage","b":2}`:             ``,
		`data: {"usage": null}`:                 ``,
		`data: {"x":{"y":1},"usage":null}` + "": `data: {"x":{"y":1}}`,
	} {
		start, end, ok := usageNull([]byte(in))
		got := ""
		if ok {
			got = in[:start] + in[end:]
		}
		if got != want {
			t.Errorf("%s: cut to %q, want %q", in, got, want)
		}
	}
}

// SetOutputLimit changes the value of the field where the body has it and
// appends it where it has not, every other byte as it was.
func TestSetOutputLimit(t *testing.T) {
	for _, tc := range []struct{ body, field, want string }{
		{`{"model":"m","max_tokens":4096,"messages":[]}`, "max_tokens", `{"model":"m","max_tokens":312,"messages":[]}`},
		{`{"model": "m", "max_tokens" : 4096 , "messages": []}`, "max_tokens", `{"model": "m", "max_tokens" : 312 , "messages": []}`},
		{`{"model":"m","messages":[{"max_tokens":1}]}`, "max_completion_tokens", `{"model":"m","messages":[{"max_tokens":1}],"max_completion_tokens":312}`},
		{"{}\n", "max_output_tokens", `{"max_output_tokens":312}`},
		{`{"max_tokens":null}`, "max_tokens", `{"max_tokens":312}`},
	} {
		got, err := SetOutputLimit([]byte(tc.body), tc.field, 312)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %s %v, want %s", tc.body, got, err, tc.want)
		}
		if r, err := ReadRequest(got); err != nil || r.MaxOutput != 312 {
			t.Errorf("%s: the result reads as %+v %v", tc.body, r, err)
		}
	}
	for _, bad := range []string{`[1]`, `not json`, `{"a":`} {
		if _, err := SetOutputLimit([]byte(bad), "max_tokens", 1); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
