package main

import (
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"
)

// proxyFile is a sidecar config that loaded, with its rules as written.
type proxyFile struct {
	path  string
	cfg   proxyconfig.Config
	rules []lintRule
	task  lintTask
}

type lintRule struct {
	Name   string                     `yaml:"name"`
	Match  lintMatch                  `yaml:"match"`
	Class  string                     `yaml:"class"`
	Charge map[string]int64           `yaml:"charge"`
	FromH  *struct{ Resource string } `yaml:"charge_from_header"`
}

type lintMatch struct {
	Host            string            `yaml:"host"`
	Port            int               `yaml:"port"`
	Scheme          string            `yaml:"scheme"`
	Method          stringOrList      `yaml:"method"`
	Path            string            `yaml:"path"`
	Header          map[string]string `yaml:"header"`
	SQL             stringOrList      `yaml:"sql"`
	Tables          stringOrList      `yaml:"tables"`
	Database        string            `yaml:"database"`
	User            string            `yaml:"user"`
	ApplicationName string            `yaml:"application_name"`
}

type lintTask struct {
	Quotas map[string]int64 `yaml:"quotas"`
	Limits map[string]int64 `yaml:"limits"`
}

// stringOrList is a YAML string or list of strings.
type stringOrList []string

func (l *stringOrList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = []string{n.Value}
		return nil
	}
	var items []string
	if err := n.Decode(&items); err != nil {
		return err
	}
	*l = items
	return nil
}

// lintProxy loads a sidecar config and lints its rules against each other;
// lintAgainstCaps checks them against governord's caps later, once it is
// known whether governord can say what they are.
func lintProxy(file string) (*proxyFile, []finding) {
	cfg, err := proxyconfig.LoadClassification(file)
	if err != nil {
		fix := "correct the key named; governor-proxy refuses to start (or to reload) with this file"
		if _, gerr := serverconfig.LoadConfig(file); gerr == nil {
			fix = "this is governord's configuration: lint it with -config " + file + " (-proxy-config is governor-proxy's)"
		}
		return nil, []finding{{Check: "config", Level: levelError, Subject: file, Problem: err.Error(), Fix: fix}}
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, []finding{{Check: "config", Level: levelError, Subject: file, Problem: err.Error()}}
	}
	var doc struct {
		Rules []lintRule `yaml:"rules"`
		Task  lintTask   `yaml:"task"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, []finding{{Check: "config", Level: levelError, Subject: file, Problem: err.Error()}}
	}
	p := &proxyFile{path: file, cfg: cfg, rules: doc.Rules, task: doc.Task}
	out := []finding{{Check: "config", Level: levelOK, Subject: file, Problem: fmt.Sprintf("loads, %d rules", len(doc.Rules))}}
	out = append(out, lintShadows(p)...)
	return p, out
}

// lintShadows finds rules an earlier rule matches whenever they would:
// first match wins, so they can never match.
func lintShadows(p *proxyFile) []finding {
	var out []finding
	for j, later := range p.rules {
		for i := range j {
			if covers(p.rules[i].Match, later.Match) {
				out = append(out, finding{Check: "rules", Level: levelWarn, Subject: fmt.Sprintf("%s: rule %d %q", p.path, j+1, later.Name),
					Problem: fmt.Sprintf("can never match: rule %d %q, earlier, matches everything it would (first match wins)", i+1, p.rules[i].Name),
					Fix:     fmt.Sprintf("move it above %q, narrow %q, or delete it", p.rules[i].Name, p.rules[i].Name)})
				break
			}
		}
	}
	return out
}

func (m lintMatch) isSQL() bool {
	return len(m.SQL) > 0 || len(m.Tables) > 0 || m.Database != "" || m.User != "" || m.ApplicationName != ""
}

func (m lintMatch) isHTTP() bool {
	return m.Host != "" || m.Port != 0 || m.Scheme != "" || len(m.Method) > 0 || m.Path != "" || len(m.Header) > 0
}

// covers reports whether every request or statement b matches, a matches
// too: each field a sets, b sets no wider.
func covers(a, b lintMatch) bool {
	if a.isSQL() != b.isSQL() && (a.isSQL() || a.isHTTP()) {
		return false // a rule of the other protocol
	}
	if b.isSQL() || a.isSQL() {
		return globCovers(a.Database, b.Database) && globCovers(a.User, b.User) && globCovers(a.ApplicationName, b.ApplicationName) &&
			kindsCover(a.SQL, b.SQL) && listCovers(a.Tables, b.Tables)
	}
	if a.Port != 0 && a.Port != b.Port {
		return false
	}
	if a.Scheme != "" && !strings.EqualFold(a.Scheme, b.Scheme) {
		return false
	}
	for k, v := range a.Header {
		if bv, ok := b.Header[k]; !ok || !globCovers(v, bv) {
			return false
		}
	}
	return globCovers(strings.ToLower(a.Host), strings.ToLower(b.Host)) && globCovers(a.Path, b.Path) && methodsCover(a.Method, b.Method)
}

// globCovers: pattern a (empty: anything) matches everything pattern b
// does. Only what can be shown is claimed: b literal and matched by a, or
// the same pattern.
func globCovers(a, b string) bool {
	if a == "" || a == "*" || a == "/*" && strings.HasPrefix(b, "/") {
		return true
	}
	if b == "" {
		return false
	}
	if a == b {
		return true
	}
	if strings.ContainsAny(b, "*?[") {
		// b is a pattern: a covers it when a is a prefix glob whose prefix b starts with.
		if prefix, ok := strings.CutSuffix(a, "*"); ok && !strings.ContainsAny(prefix, "*?[") {
			return strings.HasPrefix(b, prefix)
		}
		return false
	}
	ok, err := path.Match(a, b)
	return err == nil && ok
}

func methodsCover(a, b []string) bool {
	if len(a) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	for _, m := range b {
		if !slices.ContainsFunc(a, func(x string) bool { return strings.EqualFold(x, m) }) {
			return false
		}
	}
	return true
}

func kindsCover(a, b []string) bool {
	if len(a) == 0 || slices.Contains(a, "any") {
		return true
	}
	if len(b) == 0 || slices.Contains(b, "any") {
		return false
	}
	return methodsCover(a, b)
}

func listCovers(a, b []string) bool {
	if len(a) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	for _, t := range b {
		if !slices.ContainsFunc(a, func(x string) bool { return globCovers(x, t) }) {
			return false
		}
	}
	return true
}

// capNames are the classes some limit names and the resources some quota
// caps, and where they were read from.
type capNames struct {
	limits, quotas map[string]bool
	source         string // how the findings name it
}

func (c *capNames) add(set map[string]bool, m map[string]int64) {
	for k := range m {
		set[k] = true
	}
}

// liveCaps are the caps in force, as governord lists the tree the key
// sees: every node's own caps and defaults (caps set live included).
func liveCaps(w *treeWalk) *capNames {
	c := &capNames{limits: map[string]bool{}, quotas: map[string]bool{}, source: "the caps governord has now"}
	if len(w.nodes) > 0 && w.nodes[0].GetParentId() != 0 {
		top := w.nodes[0]
		c.source += fmt.Sprintf(", on %s and below (the caps above are outside this key's scope)", w.name(top.GetId()))
	}
	for _, n := range w.nodes {
		c.add(c.limits, n.GetLimits())
		c.add(c.limits, n.GetDefaultLimits())
		c.add(c.quotas, n.GetQuotas())
		c.add(c.quotas, n.GetDefaultQuotas())
	}
	return c
}

// configCaps are the caps governord's config file sets, for when governord
// cannot be asked.
func configCaps(g *serverconfig.Config) *capNames {
	c := &capNames{limits: map[string]bool{}, quotas: map[string]bool{}, source: "the caps in governord's config file (governord was not reached)"}
	c.add(c.limits, g.Root.Limits)
	c.add(c.quotas, g.Root.Quotas)
	for _, a := range g.Adaptive {
		c.limits[a.Class] = true
	}
	for _, t := range g.Tenants {
		c.add(c.limits, t.Limits)
		c.add(c.limits, t.Defaults.Limits)
		c.add(c.quotas, t.Quotas)
		c.add(c.quotas, t.Defaults.Quotas)
	}
	return c
}

// lintAgainstCaps finds classes the rules hold that no limit names, and
// resources they charge that no quota bounds, by caps (or the sidecar's own
// task caps), and says which caps it read.
func lintAgainstCaps(p proxyFile, caps *capNames) []finding {
	limits, quotas := maps.Clone(caps.limits), maps.Clone(caps.quotas)
	caps.add(limits, p.task.Limits)
	caps.add(quotas, p.task.Quotas)
	var out []finding
	classes, charged := map[string][]string{}, map[string][]string{}
	for _, r := range p.rules {
		if r.Class != "" {
			classes[r.Class] = append(classes[r.Class], r.Name)
		}
		for res := range r.Charge {
			charged[res] = append(charged[res], r.Name)
		}
		if r.FromH != nil && r.FromH.Resource != "" {
			charged[r.FromH.Resource] = append(charged[r.FromH.Resource], r.Name)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(classes)) {
		if !limits[c] {
			out = append(out, finding{Check: "rules", Level: levelWarn, Subject: fmt.Sprintf("%s: class %q", p.path, c),
				Problem: fmt.Sprintf("rules %s hold leases of it, but no limit names it in %s: they are counted, never bounded", strings.Join(classes[c], ", "), caps.source),
				Fix:     fmt.Sprintf("add %s: N to root.limits, a tenant's limits or defaults, or the sidecar's task.limits (or set one live: governor caps set NODE limit.%s=N -reason ...)", c, c)})
		}
	}
	for _, res := range slices.Sorted(maps.Keys(charged)) {
		if !quotas[res] {
			out = append(out, finding{Check: "rules", Level: levelWarn, Subject: fmt.Sprintf("%s: resource %q", p.path, res),
				Problem: fmt.Sprintf("rules %s charge it, but no quota caps it in %s: it is counted, never bounded", strings.Join(charged[res], ", "), caps.source),
				Fix:     fmt.Sprintf("add %s: N to root.quotas, a tenant's quotas or defaults, or the sidecar's task.quotas (or set one live: governor caps set NODE quota.%s=N -reason ...)", res, res)})
		}
	}
	if len(out) == 0 {
		out = append(out, finding{Check: "rules", Level: levelOK, Subject: p.path,
			Problem: fmt.Sprintf("every class its rules hold has a limit and every resource they charge a quota, in %s", caps.source)})
	}
	return out
}
