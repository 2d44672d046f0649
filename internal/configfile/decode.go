package configfile

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

var (
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	nodeType        = reflect.TypeFor[yaml.Node]()
	durationType    = reflect.TypeFor[time.Duration]()
)

// Decode decodes n, found at key ("" for the top level), into v, a pointer,
// under the package's rules. A caller that decodes part of a document (a
// rule) passes that part's node; the document must have come from Parse, so
// that merge keys are merged and duplicates refused.
func Decode(n *yaml.Node, key string, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("configfile: Decode needs a non-nil pointer, not %T", v)
	}
	return decode(n, rv.Elem(), key)
}

func decode(n *yaml.Node, v reflect.Value, key string) error {
	n = resolve(n)
	if isNull(n) {
		return nil // absent: v keeps its default
	}
	t := v.Type()
	switch {
	case t == nodeType:
		v.Set(reflect.ValueOf(*n))
		return nil
	case reflect.PointerTo(t).Implements(unmarshalerType):
		return yamlDecode(n, v, key)
	case t == durationType:
		if n.ShortTag() == "!!int" && strings.Trim(n.Value, "+-0") == "" {
			v.SetInt(0)
			return nil
		}
		if n.ShortTag() == "!!int" || n.ShortTag() == "!!float" {
			return Errorf(orFile(key), "line %d: %s is not a duration; give its unit, e.g. 30s or 100ms", n.Line, n.Value)
		}
		return yamlDecode(n, v, key)
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		// yaml.v3 would truncate 1.5 into 1 without a word.
		var f float64
		if n.ShortTag() == "!!float" && n.Decode(&f) == nil {
			if f != math.Trunc(f) {
				return Errorf(orFile(key), "line %d: %s is not a whole number", n.Line, n.Value)
			}
			if math.Abs(f) >= 1<<63 {
				return Errorf(orFile(key), "line %d: %s is out of range", n.Line, n.Value)
			}
		}
		return yamlDecode(n, v, key)
	case reflect.Pointer:
		p := reflect.New(t.Elem())
		if err := decode(n, p.Elem(), key); err != nil {
			return err
		}
		v.Set(p)
		return nil
	case reflect.Struct:
		return decodeStruct(n, v, key)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return yamlDecode(n, v, key)
		}
		return decodeSlice(n, v, key)
	case reflect.Map:
		if t.Key().Kind() == reflect.String {
			return decodeMap(n, v, key)
		}
	}
	return yamlDecode(n, v, key)
}

func decodeSlice(n *yaml.Node, v reflect.Value, key string) error {
	if n.Kind != yaml.SequenceNode {
		return Errorf(orFile(key), "line %d: is not a list", n.Line)
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		if err := decode(item, s.Index(i), fmt.Sprintf("%s[%d]", key, i)); err != nil {
			return err
		}
	}
	v.Set(s)
	return nil
}

func decodeMap(n *yaml.Node, v reflect.Value, key string) error {
	if n.Kind != yaml.MappingNode {
		return Errorf(orFile(key), "line %d: is not a mapping of keys to values", n.Line)
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return Errorf(orFile(key), "line %d: a key is not a plain name", k.Line)
		}
		if isNull(val) {
			continue // absent, as a struct's key with no value is
		}
		elem := reflect.New(v.Type().Elem()).Elem()
		if err := decode(val, elem, join(key, k.Value)); err != nil {
			return err
		}
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), elem)
	}
	v.Set(m)
	return nil
}

func decodeStruct(n *yaml.Node, v reflect.Value, key string) error {
	if n.Kind != yaml.MappingNode {
		return Errorf(orFile(key), "line %d: is not a mapping of keys to values", n.Line)
	}
	fields := map[string][]int{}
	collectFields(v.Type(), nil, fields)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		sub := join(key, k.Value)
		index, ok := fields[k.Value]
		if !ok {
			return unknownKey(sub, k, fields)
		}
		if err := decode(n.Content[i+1], fieldByIndex(v, index), sub); err != nil {
			return err
		}
	}
	return nil
}

// collectFields maps each key of struct t to its field's index path,
// embedded (",inline", ",squash") structs' keys included.
func collectFields(t reflect.Type, prefix []int, out map[string][]int) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts := fieldTag(f)
		index := append(append([]int(nil), prefix...), i)
		if name == "-" {
			continue
		}
		if (strings.Contains(opts, "inline") || strings.Contains(opts, "squash")) && f.Type.Kind() == reflect.Struct {
			collectFields(f.Type, index, out)
			continue
		}
		if name != "" {
			out[name] = index
		}
	}
}

func fieldTag(f reflect.StructField) (name, opts string) {
	tag, ok := f.Tag.Lookup("yaml")
	if !ok {
		tag = f.Tag.Get("mapstructure")
	}
	name, opts, _ = strings.Cut(tag, ",")
	return name, opts
}

// fieldByIndex is v.FieldByIndex that allocates embedded pointers.
func fieldByIndex(v reflect.Value, index []int) reflect.Value {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v
}

// unknownKey names the key that was probably meant, or else lists the keys
// known where it is.
func unknownKey(sub string, k *yaml.Node, fields map[string][]int) error {
	known := make([]string, 0, len(fields))
	for name := range fields {
		known = append(known, name)
	}
	sort.Strings(known)
	if isMergeKey(k) {
		return Errorf(sub, "line %d: unknown key", k.Line) // not reached: Parse merges them
	}
	if near := nearest(k.Value, known); near != "" {
		return Errorf(sub, "line %d: unknown key; did you mean %s?", k.Line, near)
	}
	return Errorf(sub, "line %d: unknown key (known here: %s)", k.Line, strings.Join(known, ", "))
}

// nearest returns the known key that differs from s only in case, or else
// by at most two edits (one for a key under six bytes); "" when none does.
func nearest(s string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(k, s) {
			return k
		}
	}
	best, bestDist := "", 3
	for _, k := range known {
		d := distance(strings.ToLower(s), k)
		if d < bestDist && d <= max(1, len(k)/3) {
			best, bestDist = k, d
		}
	}
	return best
}

// distance is the edit distance between a and b, a swap of two neighbours
// counting as one edit (optimal string alignment). Keys are short; anything
// over 64 bytes counts as too far.
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// yamlDecode lets yaml.v3 decode a value this package has no rule for (a
// scalar, a value of type any, a type with its own UnmarshalYAML).
func yamlDecode(n *yaml.Node, v reflect.Value, key string) error {
	if err := n.Decode(v.Addr().Interface()); err != nil {
		return Errorf(orFile(key), "%s", yamlProblem(err))
	}
	return nil
}

// yamlProblem shortens yaml's decode error to its substance.
func yamlProblem(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		if len(te.Errors) > 1 {
			return fmt.Sprintf("%s (and %d more)", te.Errors[0], len(te.Errors)-1)
		}
		return te.Errors[0]
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}
