// Package configfile is the one loader of Governor's YAML configuration
// files: governord's, the sidecar's, and the rules inside the sidecar's.
// Each of them keeps a private struct for the file's shape and validates it
// into its runtime config; this package decides, once for all three, how the
// text becomes that struct, and reports every problem as an *Error naming
// the key.
//
// The rules it applies, the same in every file:
//
//   - ${VAR} is expanded after parsing, one scalar at a time (package
//     envsubst), and a message never shows what a reference expanded to.
//   - A key with no value (null, "~", or a ${VAR} that expands to nothing)
//     is absent: its default applies. An error instead would make
//     "api_key: ${KEY}" with KEY unset fail for the wrong reason, and the
//     three files agreeing matters more than catching a stray "key:"; a key
//     that must be set is still refused by its own validation.
//   - Merge keys ("<<: *anchor", or a list of anchors) are accepted in every
//     mapping: keys written out win over merged ones, and of the merged
//     ones the earlier source wins, as YAML 1.1 says. Anchors are how a long
//     file shares a block; refusing them in some places was an accident.
//   - Keys are matched exactly, case included: "Reap_Interval" is an unknown
//     key, reported with the key it was probably meant to be. A case-blind
//     match would let "Listen" and "listen" both be set, with one winning
//     silently.
//   - A key given twice in one mapping is an error naming the key and both
//     lines, wherever it is (maps of caps included), never the last one
//     winning.
//   - Unknown keys are errors. A struct field's key is its yaml tag, or its
//     mapstructure tag (governord's structs are tagged that way); ",inline"
//     and ",squash" embed a struct's keys in its parent's.
//   - A duration is text with a unit ("30s"); the number 0 is also taken,
//     and any other bare number is refused rather than read as nanoseconds.
//
// viper is not used: it lower-cased keys (which let "Reap_Interval" through),
// took a duplicate key for invalid YAML without naming it, and layered
// nothing (no flags or environment variables beyond ${VAR}) that this
// package does not do.
//
// It may import the standard library, yaml.v3 and internal/envsubst.
package configfile

import (
	"errors"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/internal/envsubst"
)

// FileKey is the Key of an Error about the file as a whole.
const FileKey = "(file)"

// Error names the configuration key that is wrong and why. A binary that
// gets one on start exits with status 2.
type Error struct {
	// Key is the key at fault, e.g. "tenants[0].weight" or
	// "rules[2].match.method"; FileKey for the file as a whole.
	Key string
	// Item names the list item Key is in, for a reader who knows it by
	// name, e.g. `rule "writes"`; "" for none.
	Item    string
	Problem string
}

func (e *Error) Error() string {
	key := e.Key
	if key == "" {
		key = FileKey
	}
	if e.Item != "" {
		key += " (" + e.Item + ")"
	}
	return fmt.Sprintf("config: %s: %s", key, e.Problem)
}

// Errorf returns an *Error for key.
func Errorf(key, format string, args ...any) error {
	return &Error{Key: key, Problem: fmt.Sprintf(format, args...)}
}

// IsError reports whether err is a configuration problem (exit 2).
func IsError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// Document is a parsed configuration file: ${VAR} expanded, merge keys
// merged and keys checked to be given once.
type Document struct {
	root *yaml.Node // the top-level value; nil for an empty document
	exps envsubst.Expansions
}

// Parse parses text as one YAML document (a second one is ignored).
func Parse(text []byte) (*Document, error) {
	doc, exps, err := envsubst.Parse(text)
	if err != nil {
		return nil, Errorf(FileKey, "not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	d := &Document{exps: exps}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		d.root = doc.Content[0]
	}
	if d.root != nil {
		if err := normalize(d.root, "", map[*yaml.Node]bool{}); err != nil {
			return nil, d.Redact(err)
		}
	}
	return d, nil
}

// Empty reports whether the document holds nothing but comments.
func (d *Document) Empty() bool { return d.root == nil }

// Root is the document's top-level value, aliases resolved; nil when Empty.
func (d *Document) Root() *yaml.Node {
	if d.root == nil {
		return nil
	}
	return resolve(d.root)
}

// Lookup returns the value of the top-level key, nil when the key is absent
// or null (or the document is not a mapping).
func (d *Document) Lookup(key string) *yaml.Node {
	root := d.Root()
	if root == nil || root.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == key {
			if v := resolve(root.Content[i+1]); !isNull(v) {
				return v
			}
		}
	}
	return nil
}

// Decode decodes the whole document into v, a pointer to the file's
// struct. An empty document leaves v as it is.
func (d *Document) Decode(v any) error {
	if d.root == nil {
		return nil
	}
	return d.Redact(Decode(d.root, "", v))
}

// Redact replaces, in an *Error inside err, every value that came from a
// ${VAR} by its reference, so that no message shows a secret. Other errors
// are returned as they are.
func (d *Document) Redact(err error) error {
	var e *Error
	if errors.As(err, &e) {
		e.Problem = d.exps.Redact(e.Key, e.Problem)
		e.Item = d.exps.Redact(e.Key, e.Item)
	}
	return err
}

// normalize merges the merge keys of every mapping under n into it and
// refuses a key given twice. seen holds the mappings done, so that a
// mapping reached again through an alias is done once.
func normalize(n *yaml.Node, key string, seen map[*yaml.Node]bool) error {
	n = resolve(n)
	if seen[n] {
		return nil
	}
	seen[n] = true
	switch n.Kind {
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if err := normalize(c, fmt.Sprintf("%s[%d]", key, i), seen); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		if err := mergeInto(n, key, seen); err != nil {
			return err
		}
		lines := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			sub := join(key, k.Value)
			if first, dup := lines[k.Value]; dup {
				return Errorf(sub, "line %d: the key is given twice (first on line %d)", k.Line, first)
			}
			lines[k.Value] = k.Line
			if err := normalize(n.Content[i+1], sub, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

// maxMergeSources bounds the mappings one merge key may name.
const maxMergeSources = 100

// mergeInto replaces n's merge keys by the pairs they bring that n does
// not already have.
func mergeInto(n *yaml.Node, key string, seen map[*yaml.Node]bool) error {
	var own, merged []*yaml.Node
	var sources []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolve(n.Content[i+1])
		if !isMergeKey(k) {
			own = append(own, k, n.Content[i+1])
			continue
		}
		list := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			list = v.Content
		}
		for _, src := range list {
			src = resolve(src)
			if src.Kind != yaml.MappingNode {
				return Errorf(orFile(key), "line %d: a merge key (<<) takes a mapping or a list of them", k.Line)
			}
			sources = append(sources, src)
		}
	}
	if len(sources) == 0 {
		return nil
	}
	if len(sources) > maxMergeSources {
		return Errorf(orFile(key), "line %d: a merge key names more than %d mappings", n.Line, maxMergeSources)
	}
	have := map[string]bool{}
	for i := 0; i < len(own); i += 2 {
		have[own[i].Value] = true
	}
	for _, src := range sources {
		// A source is merged as it is once its own merge keys are.
		if err := normalize(src, key, seen); err != nil {
			return err
		}
		for i := 0; i+1 < len(src.Content); i += 2 {
			if k := src.Content[i]; !have[k.Value] {
				have[k.Value] = true
				merged = append(merged, k, src.Content[i+1])
			}
		}
	}
	n.Content = append(own, merged...)
	return nil
}

func isMergeKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge"
}

func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func join(key, sub string) string {
	if key == "" {
		return sub
	}
	return key + "." + sub
}

func orFile(key string) string {
	if key == "" {
		return FileKey
	}
	return key
}
