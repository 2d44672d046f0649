// Package envsubst reads YAML configuration with ${VAR} references in its
// values, for package configfile, the one loader of governord's, the
// proxy's and the rules' files.
// References are expanded after parsing, in one scalar value at a time, so a
// variable's value is only ever data: a "#", ":", "{" or newline in a secret
// can neither cut the value short, start a comment nor add a key. What it
// expanded is returned, so that a message about a value can name the
// variable instead of showing the value (Expansions.Redact).
//
// It may import the standard library and yaml.v3.
package envsubst

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

var ref = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Expansion is one scalar value that held a ${VAR} reference.
type Expansion struct {
	Key   string     // where the value is, e.g. "tenants[0].api_key"
	Ref   string     // the value as written, e.g. "${PAYMENTS_KEY}"
	Value string     // what it expanded to
	Node  *yaml.Node // the node, which now holds Value
}

// Vars are the variables the value refers to, as ${NAME}, in order.
func (e Expansion) Vars() []string { return ref.FindAllString(e.Ref, -1) }

// Expansions are the values one document expanded.
type Expansions []Expansion

// Parse parses a YAML document and replaces each ${VAR} in its scalar values
// with the variable's value; an unset variable becomes empty. Only the
// braced form is expanded, so a "$" elsewhere is left alone. Keys and
// comments are left as written, and an alias is expanded where its anchor
// is (once).
//
// A quoted value stays a string. A plain one is typed again from what it
// expanded to, as if that had been written in its place as one value:
// "true" is a bool, "30s" a string, and nothing at all is null, so an empty
// variable reads as an absent key and its default applies.
//
// A reference may stand anywhere a plain value may, inside flow mappings and
// lists too ("task: {name: ${POD_NAME}}"), although "$" and "{" could not
// start a plain value there: before parsing, each reference is masked by a
// token made only of letters, digits and underscores, and the token is what
// is replaced in the parsed values.
func Parse(text []byte) (*yaml.Node, Expansions, error) {
	m := newMask(text)
	var doc yaml.Node
	if err := yaml.Unmarshal(m.masked, &doc); err != nil {
		return nil, nil, errors.New(m.unmask(err.Error()))
	}
	var out Expansions
	m.expand(&doc, "", &out)
	return &doc, out, nil
}

// mask stands in for the references of one text while YAML parses it.
type mask struct {
	prefix string   // every token starts with it; the text holds it nowhere
	refs   []string // token i stands for refs[i], e.g. "${POD_NAME}"
	masked []byte
	token  *regexp.Regexp
}

func newMask(text []byte) *mask {
	m := &mask{}
	for {
		var nonce [8]byte
		rand.Read(nonce[:])
		m.prefix = "envsubst" + hex.EncodeToString(nonce[:]) + "x"
		if !strings.Contains(string(text), m.prefix) {
			break
		}
	}
	m.token = regexp.MustCompile(m.prefix + `([0-9]+)x`)
	m.masked = ref.ReplaceAllFunc(text, func(r []byte) []byte {
		m.refs = append(m.refs, string(r))
		return []byte(fmt.Sprintf("%s%dx", m.prefix, len(m.refs)-1))
	})
	return m
}

// unmask puts the references back as written.
func (m *mask) unmask(s string) string { return m.replace(s, func(r string) string { return r }) }

// replace replaces each token in s by f of the reference it stands for.
func (m *mask) replace(s string, f func(ref string) string) string {
	if len(m.refs) == 0 || !strings.Contains(s, m.prefix) {
		return s
	}
	return m.token.ReplaceAllStringFunc(s, func(tok string) string {
		i, err := strconv.Atoi(m.token.FindStringSubmatch(tok)[1])
		if err != nil || i >= len(m.refs) {
			return tok
		}
		return f(m.refs[i])
	})
}

func (m *mask) expand(n *yaml.Node, key string, out *Expansions) {
	n.HeadComment, n.LineComment, n.FootComment = m.unmask(n.HeadComment), m.unmask(n.LineComment), m.unmask(n.FootComment)
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			k := key
			if n.Kind == yaml.SequenceNode {
				k = fmt.Sprintf("%s[%d]", key, i)
			}
			m.expand(c, k, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			kn := n.Content[i]
			m.expand(kn, "", nil) // a key stays as written
			k := kn.Value
			if key != "" {
				k = key + "." + k
			}
			m.expand(n.Content[i+1], k, out)
		}
	case yaml.ScalarNode:
		if !strings.Contains(n.Value, m.prefix) {
			return
		}
		written := m.unmask(n.Value)
		if out == nil {
			n.Value = written
			return
		}
		n.Value = m.replace(n.Value, func(r string) string { return os.Getenv(r[2 : len(r)-1]) })
		if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle|yaml.TaggedStyle) == 0 {
			n.Tag = "" // resolved again from the new value when decoded
			if n.Value == "" {
				n.Tag = "!!null"
			}
		}
		*out = append(*out, Expansion{Key: key, Ref: written, Value: n.Value, Node: n})
	}
}

// Of returns the expansion that node n holds, if any.
func (e Expansions) Of(n *yaml.Node) (Expansion, bool) {
	for _, x := range e {
		if x.Node == n {
			return x, true
		}
	}
	return Expansion{}, false
}

// RedactMin is the length from which an expanded value is hidden in any
// message, whatever key the message is about. A shorter one (a port, a
// flag) is hidden only in a message about its own key, so that "line 1"
// does not lose its digit to a variable whose value is "1".
const RedactMin = 4

// leakWindow is the length of the pieces of a value that Redact looks for
// once it has replaced the forms it knows: a message that still holds one
// is cut off there.
const leakWindow = 8

// Redact returns msg, a message about key ("" for none in particular),
// with every expanded value in it replaced by the reference it came from,
// so that an error names the key and the variable and never shows a
// secret. Values are found as written, as Go quotes them (%q, and
// time.ParseDuration's quoting) and as yaml.v3 shortens them in its type
// errors; should a piece of one still remain, the message is cut off before
// it. A message about a key whose value was expanded names the variable
// even when it did not show the value.
func (e Expansions) Redact(key, msg string) string {
	xs := make(Expansions, 0, len(e))
	var own []string // the references of key's own value
	for _, x := range e {
		if x.Value == "" || x.Value == x.Ref {
			continue
		}
		rel := related(key, x.Key)
		if rel {
			own = append(own, x.Ref)
		}
		if len(x.Value) >= RedactMin || rel {
			xs = append(xs, x)
		}
	}
	// The longest first, so that a value inside another is not replaced
	// in part.
	sort.SliceStable(xs, func(i, j int) bool { return len(xs[i].Value) > len(xs[j].Value) })
	for _, x := range xs {
		for _, form := range forms(x.Value) {
			msg = strings.ReplaceAll(msg, form, x.Ref)
		}
		if len(x.Value) > 10 {
			// yaml.v3's "cannot unmarshal !!str `abcdefg...` into ..."
			msg = strings.ReplaceAll(msg, "`"+x.Value[:7]+"...`", "`"+x.Ref+"`")
		}
	}
	for _, x := range xs {
		for i := 0; i+leakWindow <= len(x.Value); i++ {
			if at := strings.Index(msg, x.Value[i:i+leakWindow]); at >= 0 {
				msg = msg[:at] + "… (the rest is not shown: it holds the value of " + x.Ref + ")"
			}
		}
	}
	if len(own) > 0 && !mentionsAny(msg, own) {
		msg += " (the value comes from " + strings.Join(own, ", ") + ")"
	}
	return msg
}

// forms are the ways a message may show v: as it is, quoted by strconv
// (%q) and quoted by package time.
func forms(v string) []string {
	q := strconv.Quote(v)
	t := timeQuote(v)
	return []string{v, q[1 : len(q)-1], t[1 : len(t)-1]}
}

// timeQuote quotes s as package time does in its errors: bytes outside
// printable ASCII as \xNN, and " and \ escaped.
func timeQuote(s string) string {
	const hex = "0123456789abcdef"
	b := []byte{'"'}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c < ' ' || c >= 0x7f:
			b = append(b, '\\', 'x', hex[c>>4], hex[c&0xf])
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		default:
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}

func mentionsAny(msg string, refs []string) bool {
	for _, r := range refs {
		if strings.Contains(msg, r) {
			return true
		}
	}
	return false
}

// related reports whether a message about key may be about the value at
// at: the same key, one under it, or one above it. Keys are compared with
// "[x]" read as ".x", since decoders name map entries either way.
func related(key, at string) bool {
	if key == "" {
		return false
	}
	key, at = normKey(key), normKey(at)
	under := func(a, b string) bool {
		return strings.HasPrefix(a, b) && (len(a) == len(b) || a[len(b)] == '.')
	}
	return under(key, at) || under(at, key)
}

func normKey(k string) string { return strings.NewReplacer("[", ".", "]", "").Replace(k) }
