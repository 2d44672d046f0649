package kubeinject

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Operation is one operation of an RFC 6902 JSON patch. Diff writes only
// add, replace and remove.
type Operation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"` // nil only for remove
}

// Diff returns the JSON patch that turns the JSON document before into
// after. Objects are compared key by key; an array is compared by its
// common head and tail, so that elements inserted or removed in one run
// (the init containers put first, env variables appended) are adds and
// removes, elements changed in place are patched inside, and anything else
// replaces the array whole. Keys are visited in sorted order, so the patch
// of two documents is always the same.
func Diff(before, after []byte) ([]Operation, error) {
	a, err := decodeJSON(before)
	if err != nil {
		return nil, fmt.Errorf("diff: before: %w", err)
	}
	b, err := decodeJSON(after)
	if err != nil {
		return nil, fmt.Errorf("diff: after: %w", err)
	}
	var ops []Operation
	diffValue("", a, b, &ops)
	return ops, nil
}

// decodeJSON keeps numbers as written, so that an integer stays one.
func decodeJSON(text []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func diffValue(path string, a, b any, ops *[]Operation) {
	if reflect.DeepEqual(a, b) {
		return
	}
	switch a := a.(type) {
	case map[string]any:
		if b, ok := b.(map[string]any); ok {
			diffObject(path, a, b, ops)
			return
		}
	case []any:
		if b, ok := b.([]any); ok {
			diffArray(path, a, b, ops)
			return
		}
	}
	*ops = append(*ops, Operation{Op: "replace", Path: path, Value: b})
}

func diffObject(path string, a, b map[string]any, ops *[]Operation) {
	for _, k := range sortedKeys(a) {
		if _, ok := b[k]; !ok {
			*ops = append(*ops, Operation{Op: "remove", Path: path + "/" + escapePointer(k)})
		}
	}
	for _, k := range sortedKeys(b) {
		p := path + "/" + escapePointer(k)
		if av, ok := a[k]; ok {
			diffValue(p, av, b[k], ops)
		} else {
			*ops = append(*ops, Operation{Op: "add", Path: p, Value: b[k]})
		}
	}
}

func diffArray(path string, a, b []any, ops *[]Operation) {
	head := 0
	for head < len(a) && head < len(b) && reflect.DeepEqual(a[head], b[head]) {
		head++
	}
	tail := 0
	for tail < len(a)-head && tail < len(b)-head && reflect.DeepEqual(a[len(a)-1-tail], b[len(b)-1-tail]) {
		tail++
	}
	aMid, bMid := a[head:len(a)-tail], b[head:len(b)-tail]
	switch {
	case len(aMid) == 0:
		for i, v := range bMid {
			at := strconv.Itoa(head + i)
			if tail == 0 {
				at = "-" // the end: what "append" means to a reader
			}
			*ops = append(*ops, Operation{Op: "add", Path: path + "/" + at, Value: v})
		}
	case len(bMid) == 0:
		removeRun(path, head, len(aMid), ops)
	case len(aMid) == len(bMid) || tail == 0:
		// Changed in place, and at the end some added or removed.
		n := min(len(aMid), len(bMid))
		for i := range n {
			diffValue(path+"/"+strconv.Itoa(head+i), aMid[i], bMid[i], ops)
		}
		for _, v := range bMid[n:] {
			*ops = append(*ops, Operation{Op: "add", Path: path + "/-", Value: v})
		}
		removeRun(path, head+n, len(aMid)-n, ops)
	default:
		*ops = append(*ops, Operation{Op: "replace", Path: path, Value: b})
	}
}

// removeRun removes n elements from index at, the last first, so that
// each index still names the element it meant.
func removeRun(path string, at, n int, ops *[]Operation) {
	for i := at + n - 1; i >= at; i-- {
		*ops = append(*ops, Operation{Op: "remove", Path: path + "/" + strconv.Itoa(i)})
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// escapePointer escapes a key for a JSON pointer (RFC 6901): the
// annotation governor.dev/inject is governor.dev~1inject.
func escapePointer(k string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
}

// splitPointer is escapePointer's inverse, for a whole path.
func splitPointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("JSON pointer %q does not start with /", p)
	}
	parts := strings.Split(p[1:], "/")
	for i, s := range parts {
		parts[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(s)
	}
	return parts, nil
}
