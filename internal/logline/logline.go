// Package logline reads the log lines Governor's daemons write: JSON
// (governor-proxy) or slog's text format (governord). Tests and govbench use
// it to learn what a process they started has bound and done. It imports
// the standard library only.
package logline

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Parse returns the fields of one line, JSON or key=value; an unreadable
// line gives what could be read of it.
func Parse(line string) map[string]any {
	m := map[string]any{}
	if json.Unmarshal([]byte(line), &m) == nil {
		return m
	}
	m = map[string]any{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		key, rest, ok := strings.Cut(line, "=")
		if !ok {
			break
		}
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				break
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			val, rest, _ = strings.Cut(rest, " ")
		}
		m[key] = val
		line = rest
	}
	return m
}

// Find returns the fields of the first line of text whose msg is msg.
func Find(text, msg string) (map[string]any, bool) {
	for _, l := range strings.Split(text, "\n") {
		if m := Parse(l); m["msg"] == msg {
			return m, true
		}
	}
	return nil, false
}
