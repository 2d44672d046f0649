package kubeinject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
)

// ManifestResult is what InjectManifests did with one pod template.
type ManifestResult struct {
	Document int    // 1-based, in the stream
	Kind     string // Deployment, Pod, ...
	Name     string
	Outcome  Outcome
}

// templatePaths are where each workload kind keeps its pod template; a Pod
// is its own.
var templatePaths = map[string][]string{
	"v1 Pod":                   {},
	"v1 PodTemplate":           {"template"},
	"v1 ReplicationController": {"spec", "template"},
	"apps/v1 Deployment":       {"spec", "template"},
	"apps/v1 StatefulSet":      {"spec", "template"},
	"apps/v1 DaemonSet":        {"spec", "template"},
	"apps/v1 ReplicaSet":       {"spec", "template"},
	"batch/v1 Job":             {"spec", "template"},
	"batch/v1 CronJob":         {"spec", "jobTemplate", "spec", "template"},
}

// InjectManifests reads a stream of YAML documents and writes it out with
// every pod template that asks for the sidecar injected, the same patch
// the webhook would answer applied to it. Other documents, and everything
// of an injected one but what the patch changes, keep their content and
// comments; a v1 List's items are injected one by one. It fails on the
// first template the webhook would refuse, naming it, and writes nothing
// then.
func InjectManifests(in io.Reader, out io.Writer, cfg Config) ([]ManifestResult, error) {
	dec := yaml.NewDecoder(in)
	var docs []*yaml.Node
	var results []ManifestResult
	for n := 1; ; n++ {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		docs = append(docs, &doc)
		if len(doc.Content) == 0 {
			continue
		}
		r, err := injectObject(doc.Content[0], n, cfg)
		if err != nil {
			return nil, err
		}
		results = append(results, r...)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	for _, d := range docs {
		if err := enc.Encode(d); err != nil {
			return nil, fmt.Errorf("writing the manifests: %w", err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("writing the manifests: %w", err)
	}
	_, err := out.Write(buf.Bytes())
	return results, err
}

func injectObject(obj *yaml.Node, doc int, cfg Config) ([]ManifestResult, error) {
	if obj.Kind != yaml.MappingNode {
		return nil, nil
	}
	apiVersion, kind := scalar(obj, "apiVersion"), scalar(obj, "kind")
	name := ""
	if m := child(obj, "metadata"); m != nil {
		name = scalar(m, "name")
	}
	if apiVersion == "v1" && kind == "List" {
		var results []ManifestResult
		if items := child(obj, "items"); items != nil && items.Kind == yaml.SequenceNode {
			for _, item := range items.Content {
				r, err := injectObject(item, doc, cfg)
				if err != nil {
					return nil, err
				}
				results = append(results, r...)
			}
		}
		return results, nil
	}
	path, ok := templatePaths[apiVersion+" "+kind]
	if !ok {
		return nil, nil
	}
	tmpl := obj
	for _, key := range path {
		if tmpl = child(tmpl, key); tmpl == nil {
			return nil, nil
		}
	}
	where := fmt.Sprintf("document %d (%s %s)", doc, kind, name)
	outcome, err := injectTemplate(tmpl, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return []ManifestResult{{Document: doc, Kind: kind, Name: name, Outcome: outcome}}, nil
}

// injectTemplate injects a pod template (metadata and spec, as a Pod has
// them) in place, through the same patch as the webhook's.
func injectTemplate(tmpl *yaml.Node, cfg Config) (Outcome, error) {
	text, err := yaml.Marshal(tmpl)
	if err != nil {
		return "", err
	}
	var asJSON any
	if err := yaml.Unmarshal(text, &asJSON); err != nil {
		return "", err
	}
	js, err := json.Marshal(asJSON)
	if err != nil {
		return "", fmt.Errorf("the pod template is not JSON: %w", err)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(js, &pod); err != nil {
		return "", fmt.Errorf("the pod template: %w", err)
	}
	outcome, patch, err := PatchPod(&pod, cfg)
	if err != nil || patch == nil {
		return outcome, err
	}
	var ops []Operation
	if err := json.Unmarshal(patch, &ops); err != nil {
		return "", err
	}
	for _, op := range ops {
		if err := applyToNode(tmpl, op); err != nil {
			return "", fmt.Errorf("applying %s %s: %w", op.Op, op.Path, err)
		}
	}
	return outcome, nil
}

// applyToNode applies one operation of Diff's to a YAML tree.
func applyToNode(root *yaml.Node, op Operation) error {
	parts, err := splitPointer(op.Path)
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		return errors.New("the patch replaces the whole template")
	}
	parent := root
	for _, p := range parts[:len(parts)-1] {
		if parent = step(parent, p); parent == nil {
			return errors.New("no such path in the manifest")
		}
	}
	last := parts[len(parts)-1]
	var value *yaml.Node
	if op.Op != "remove" {
		if value, err = toNode(op.Value); err != nil {
			return err
		}
	}
	switch parent.Kind {
	case yaml.MappingNode:
		i := keyIndex(parent, last)
		switch {
		case op.Op == "remove" && i >= 0:
			parent.Content = append(parent.Content[:i], parent.Content[i+2:]...)
		case op.Op == "remove" || op.Op == "replace" && i < 0:
			return fmt.Errorf("no key %q", last)
		case i >= 0:
			parent.Content[i+1] = value
		default:
			parent.Content = append(parent.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: last}, value)
		}
	case yaml.SequenceNode:
		if last == "-" && op.Op == "add" {
			parent.Content = append(parent.Content, value)
			return nil
		}
		i, err := strconv.Atoi(last)
		if err != nil || i < 0 || i > len(parent.Content) || i == len(parent.Content) && op.Op != "add" {
			return fmt.Errorf("no index %q of %d", last, len(parent.Content))
		}
		switch op.Op {
		case "add":
			parent.Content = append(parent.Content[:i], append([]*yaml.Node{value}, parent.Content[i:]...)...)
		case "replace":
			parent.Content[i] = value
		case "remove":
			parent.Content = append(parent.Content[:i], parent.Content[i+1:]...)
		}
	default:
		return errors.New("the path goes through a scalar")
	}
	return nil
}

// toNode turns a JSON value into YAML in block style, like the rest of a
// manifest, each object's name first as people write them; the encoder
// quotes a string that would read as another type.
func toNode(v any) (*yaml.Node, error) {
	text, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return nil, err
	}
	n := doc.Content[0]
	var plain func(*yaml.Node)
	plain = func(n *yaml.Node) {
		n.Style = 0
		if i := keyIndex(n, "name"); n.Kind == yaml.MappingNode && i > 0 {
			pair := slices.Clone(n.Content[i : i+2])
			n.Content = append(pair, slices.Delete(n.Content, i, i+2)...)
		}
		for _, c := range n.Content {
			plain(c)
		}
	}
	plain(n)
	return n, nil
}

func step(n *yaml.Node, key string) *yaml.Node {
	switch n.Kind {
	case yaml.MappingNode:
		return child(n, key)
	case yaml.SequenceNode:
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(n.Content) {
			return nil
		}
		return n.Content[i]
	}
	return nil
}

func keyIndex(m *yaml.Node, key string) int {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return i
		}
	}
	return -1
}

func child(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	if i := keyIndex(m, key); i >= 0 {
		return m.Content[i+1]
	}
	return nil
}

func scalar(m *yaml.Node, key string) string {
	if c := child(m, key); c != nil && c.Kind == yaml.ScalarNode {
		return c.Value
	}
	return ""
}
