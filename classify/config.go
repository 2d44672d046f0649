package classify

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/internal/envsubst"
)

// Limits on what a rule file may hold.
const (
	// MaxFileSize bounds a rule file that Load or a Watcher reads.
	MaxFileSize = 4 << 20
	// MaxNameLen matches the engine's bound on names (rules, classes,
	// resources), so a rule that validates here is not refused later.
	MaxNameLen = 256
)

// Error is a rule file that fails to load. It names the rule (by index and
// name) and the field, e.g.
//
//	rules[2] "writes": match.method: "FETCH" is not an HTTP method
//
// Parse, Load and a Watcher's reload return the first problem they find as an
// *Error; the file is then rejected as a whole.
type Error struct {
	Index   int    // the rule's index in rules:, or -1 when the problem is not in one rule
	Rule    string // the rule's name, when it has one
	Field   string // e.g. "match.method"; "" for the rule (or the file) as a whole
	Problem string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Index >= 0 {
		fmt.Fprintf(&b, "rules[%d]", e.Index)
		if e.Rule != "" {
			fmt.Fprintf(&b, " %q", e.Rule)
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// Key returns the config key at fault, e.g. "rules[2].match.method", for a
// caller that reports config errors by key.
func (e *Error) Key() string {
	switch {
	case e.Index >= 0 && e.Field != "":
		return fmt.Sprintf("rules[%d].%s", e.Index, e.Field)
	case e.Index >= 0:
		return fmt.Sprintf("rules[%d]", e.Index)
	case e.Field != "":
		return e.Field
	}
	return "(file)"
}

// The file's shape, kept apart from the compiled rules so that what YAML
// allows (absent vs empty, one method or a list) and what matching runs on
// can differ. Every key is strict: decodeStrict refuses one not listed here.
type fileRule struct {
	Name             *string            `yaml:"name"`
	Match            *fileMatch         `yaml:"match"`
	Class            *string            `yaml:"class"`
	Charge           map[string]integer `yaml:"charge"`
	ChargeFromHeader *fileHeaderCharge  `yaml:"charge_from_header"`
	Meter            yaml.Node          `yaml:"meter"`
	Read             *bool              `yaml:"read"`
	Mode             *string            `yaml:"mode"`
	OnRate           *string            `yaml:"on_rate"`
}

type fileMatch struct {
	// HTTP
	Host   *string           `yaml:"host"`
	Port   *integer          `yaml:"port"`
	Scheme *string           `yaml:"scheme"`
	Method stringList        `yaml:"method"`
	Path   *string           `yaml:"path"`
	Header map[string]string `yaml:"header"`
	// SQL
	SQL             stringList `yaml:"sql"`
	Tables          stringList `yaml:"tables"`
	Database        *string    `yaml:"database"`
	User            *string    `yaml:"user"`
	ApplicationName *string    `yaml:"application_name"`
}

type fileHeaderCharge struct {
	Resource *string `yaml:"resource"`
	Header   *string `yaml:"header"`
}

// integer is a whole number. yaml itself would truncate 1.5 into an int
// without a word; a charge of 1.5 is a mistake to report, not to round.
type integer int64

func (i *integer) UnmarshalYAML(n *yaml.Node) error {
	switch n.ShortTag() {
	case "!!int":
		var v int64
		if err := n.Decode(&v); err != nil {
			return err
		}
		*i = integer(v)
		return nil
	case "!!float":
		var f float64
		if err := n.Decode(&f); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<63 {
			*i = integer(f)
			return nil
		}
	}
	return fmt.Errorf("line %d: %q is not a whole number", n.Line, n.Value)
}

// stringList is one string or a list of them.
type stringList struct {
	set   bool
	items []string
}

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	l.set = true
	if n.Kind == yaml.ScalarNode {
		var s string
		if err := n.Decode(&s); err != nil {
			return err
		}
		l.items = []string{s}
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return fmt.Errorf("line %d: want a string or a list of strings", n.Line)
	}
	return n.Decode(&l.items)
}

// Load reads the YAML file at path and parses its rules: key like Parse.
func Load(path string) (*Rules, error) {
	text, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(text)
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read rules: %w", err)
	}
	defer f.Close()
	text, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read rules: %w", err)
	}
	if len(text) > MaxFileSize {
		return nil, fmt.Errorf("read rules: %s is larger than %d bytes", path, MaxFileSize)
	}
	return text, nil
}

// Parse compiles the rules: key of a YAML document: the proxy's whole config
// file, of which it reads only that key and ignores every other top-level
// key. ${VAR} references in values are expanded after parsing (package
// envsubst), and an error shows a reference rather than the value it
// expanded to. A document without a rules: key
// (or with "rules: []") has no rules and matches nothing; an empty document
// is an error, so that a file caught half-written is not taken for "no
// rules".
func Parse(text []byte) (*Rules, error) {
	rs, _, err := parse(text)
	return rs, err
}

// parse is Parse, also saying whether the document has a rules: list at all
// (a rules: key that is absent or null reads as zero rules).
func parse(text []byte) (*Rules, bool, error) {
	rs, err := parseDoc(text)
	if err != nil || rs.listed {
		return rs, rs != nil && rs.listed, err
	}
	return rs, false, nil
}

func parseDoc(text []byte) (*Rules, error) {
	doc, exps, err := envsubst.Parse(text)
	if err != nil {
		return nil, &Error{Index: -1, Problem: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	rs, err := parseNode(doc)
	var e *Error
	if errors.As(err, &e) {
		// A value that came from ${VAR} is shown as its reference, never
		// as what it expanded to, which may be a secret.
		e.Rule, e.Problem = exps.Redact(e.Key(), e.Rule), exps.Redact(e.Key(), e.Problem)
	}
	return rs, err
}

func parseNode(doc *yaml.Node) (*Rules, error) {
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &Error{Index: -1, Problem: "the document is empty"}
	}
	top := resolve(doc.Content[0])
	if top.Kind != yaml.MappingNode {
		return nil, &Error{Index: -1, Problem: "the document is not a mapping of keys to values"}
	}
	var rulesNode *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "rules" {
			continue
		}
		if rulesNode != nil {
			return nil, &Error{Index: -1, Field: "rules", Problem: fmt.Sprintf("line %d: the key is given twice", top.Content[i].Line)}
		}
		rulesNode = resolve(top.Content[i+1])
	}
	if rulesNode == nil || isNull(rulesNode) {
		return &Rules{}, nil
	}
	if rulesNode.Kind != yaml.SequenceNode {
		return nil, &Error{Index: -1, Field: "rules", Problem: fmt.Sprintf("line %d: is not a list of rules", rulesNode.Line)}
	}
	rs := &Rules{rules: make([]rule, 0, len(rulesNode.Content)), listed: true}
	seen := map[string]int{}
	for i, n := range rulesNode.Content {
		n = resolve(n)
		name := peekName(n)
		fail := func(field, format string, args ...any) error {
			return &Error{Index: i, Rule: name, Field: field, Problem: fmt.Sprintf(format, args...)}
		}
		if n.Kind != yaml.MappingNode {
			return nil, fail("", "line %d: is not a mapping of keys to values", n.Line)
		}
		var fr fileRule
		if err := decodeStrict(n, reflect.ValueOf(&fr).Elem(), ""); err != nil {
			var fe *fieldError
			if errors.As(err, &fe) {
				return nil, fail(fe.field, "%s", fe.problem)
			}
			return nil, fail("", "%v", err)
		}
		r, err := compileRule(&fr)
		if err != nil {
			var fe *fieldError
			if errors.As(err, &fe) {
				return nil, fail(fe.field, "%s", fe.problem)
			}
			return nil, fail("", "%v", err)
		}
		if j, dup := seen[r.decision.Rule]; dup {
			return nil, fail("name", "%q is the name of rules[%d] too; names are unique", r.decision.Rule, j)
		}
		seen[r.decision.Rule] = i
		rs.rules = append(rs.rules, r)
	}
	return rs, nil
}

// fieldError is a problem with one field of a rule.
type fieldError struct {
	field, problem string
}

func (e *fieldError) Error() string { return e.field + ": " + e.problem }

func fieldErr(field, format string, args ...any) error {
	return &fieldError{field: field, problem: fmt.Sprintf(format, args...)}
}

func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		return resolve(n.Content[0])
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// peekName finds a rule's name before decoding it, so that any error about
// the rule can name it.
func peekName(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if v := resolve(n.Content[i+1]); n.Content[i].Value == "name" && v.Kind == yaml.ScalarNode && !isNull(v) {
			return v.Value
		}
	}
	return ""
}

// decodeStrict decodes the mapping n into the struct v, refusing keys the
// struct has no field for, keys given twice and keys without a value, and
// naming the field in every error. Values that are not structs are decoded
// by yaml itself.
func decodeStrict(n *yaml.Node, v reflect.Value, prefix string) error {
	n = resolve(n)
	where := strings.TrimSuffix(prefix, ".")
	if n.Kind != yaml.MappingNode {
		return fieldErr(where, "line %d: is not a mapping of keys to values", n.Line)
	}
	t := v.Type()
	pairs, err := mergedPairs(n, where, 0)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, p := range pairs {
		k, val := p.key, p.val
		key := k.Value
		if p.merged && seen[key] {
			continue // a key written out overrides the one merged in
		}
		field := -1
		for f := 0; f < t.NumField(); f++ {
			if strings.Split(t.Field(f).Tag.Get("yaml"), ",")[0] == key {
				field = f
				break
			}
		}
		if field < 0 {
			return fieldErr(where, "line %d: unknown key %q (known: %s)", k.Line, key, knownKeys(t))
		}
		if seen[key] {
			return fieldErr(prefix+key, "line %d: the key is given twice", k.Line)
		}
		seen[key] = true
		if isNull(val) {
			return fieldErr(prefix+key, "line %d: has no value", k.Line)
		}
		fv := v.Field(field)
		if fv.Kind() == reflect.Pointer && fv.Type().Elem().Kind() == reflect.Struct {
			fv.Set(reflect.New(fv.Type().Elem()))
			if err := decodeStrict(val, fv.Elem(), prefix+key+"."); err != nil {
				return err
			}
			continue
		}
		if err := val.Decode(fv.Addr().Interface()); err != nil {
			return fieldErr(prefix+key, "%s", yamlProblem(err))
		}
	}
	return nil
}

type pair struct {
	key, val *yaml.Node
	merged   bool // came from a "<<" merge key
}

// mergedPairs lists the key-value pairs of the mapping n: its own first,
// then those of any YAML merge keys ("<<: *anchor"), marked as merged.
func mergedPairs(n *yaml.Node, where string, depth int) ([]pair, error) {
	if depth > 10 {
		return nil, fieldErr(where, "line %d: merge keys nest too deep", n.Line)
	}
	var own, merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!merge" {
			own = append(own, pair{key: k, val: val})
			continue
		}
		sources := []*yaml.Node{val}
		if val.Kind == yaml.SequenceNode {
			sources = val.Content
		}
		for _, src := range sources {
			src = resolve(src)
			if src.Kind != yaml.MappingNode {
				return nil, fieldErr(where, "line %d: a merge key (<<) takes a mapping or a list of them", k.Line)
			}
			ps, err := mergedPairs(src, where, depth+1)
			if err != nil {
				return nil, err
			}
			for _, p := range ps {
				p.merged = true
				merged = append(merged, p)
			}
		}
	}
	return append(own, merged...), nil
}

func knownKeys(t reflect.Type) string {
	keys := make([]string, t.NumField())
	for f := range keys {
		keys[f] = strings.Split(t.Field(f).Tag.Get("yaml"), ",")[0]
	}
	return strings.Join(keys, ", ")
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

var httpMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace}

// compileRule validates one decoded rule and compiles its patterns.
func compileRule(fr *fileRule) (rule, error) {
	var r rule
	if fr.Name == nil {
		return r, fieldErr("name", "is missing; every rule needs a unique name")
	}
	if err := checkName(*fr.Name); err != nil {
		return r, fieldErr("name", "%v", err)
	}
	r.decision.Rule = *fr.Name
	if fr.Class != nil {
		if err := checkName(*fr.Class); err != nil {
			return r, fieldErr("class", "%v; leave the key out for no lease", err)
		}
		r.decision.Class = *fr.Class
	}
	for _, res := range sortedKeys(fr.Charge) {
		if err := checkName(res); err != nil {
			return r, fieldErr("charge", "a resource name %v", err)
		}
		if amt := fr.Charge[res]; amt <= 0 {
			return r, fieldErr("charge."+res, "%d is not a positive amount", amt)
		}
	}
	if fr.Read != nil {
		r.decision.Read = *fr.Read
	}
	if fr.Mode != nil {
		switch *fr.Mode {
		case "enforce":
		case "shadow":
			r.decision.Shadow = true
		default:
			return r, fieldErr("mode", "%q is not enforce or shadow", *fr.Mode)
		}
	}
	if fr.OnRate != nil {
		switch *fr.OnRate {
		case "wait":
		case "deny":
			r.decision.DenyRate = true
		default:
			return r, fieldErr("on_rate", "%q is not wait or deny", *fr.OnRate)
		}
	}
	if len(fr.Charge) > 0 {
		r.decision.Charges = make(map[string]int64, len(fr.Charge))
		for res, amt := range fr.Charge {
			r.decision.Charges[res] = int64(amt)
		}
	}
	if hc := fr.ChargeFromHeader; hc != nil {
		switch {
		case hc.Resource == nil:
			return r, fieldErr("charge_from_header.resource", "is missing")
		case hc.Header == nil:
			return r, fieldErr("charge_from_header.header", "is missing")
		}
		if err := checkName(*hc.Resource); err != nil {
			return r, fieldErr("charge_from_header.resource", "%v", err)
		}
		if !isToken(*hc.Header) {
			return r, fieldErr("charge_from_header.header", "%q is not a header name", *hc.Header)
		}
		r.decision.ChargeFromHeader = &HeaderCharge{Resource: *hc.Resource,
			Header: textproto.CanonicalMIMEHeaderKey(*hc.Header)}
	}
	if fr.Meter.Kind != 0 {
		m, err := compileMeter(&fr.Meter)
		if err != nil {
			return r, err
		}
		switch {
		case r.decision.ChargeFromHeader != nil:
			return r, fieldErr("meter", "a rule charges from a header or meters its calls, not both")
		case r.decision.Charges[m.Resource] != 0:
			return r, fieldErr("meter", "%s is metered; the rule cannot charge it too", m.Resource)
		}
		r.decision.Meter = m
	}
	if fr.Match == nil {
		return r, nil // no match: matches everything, like match: {}
	}
	return r, compileMatch(&r, fr.Match)
}

func compileMatch(r *rule, m *fileMatch) error {
	httpFields, err := compileHTTPMatch(r, m)
	if err != nil {
		return err
	}
	sqlFields, err := compileSQLMatch(r, m)
	if err != nil {
		return err
	}
	switch {
	case len(httpFields) > 0 && len(sqlFields) > 0:
		return fieldErr("match", "mixes HTTP fields (%s) with SQL fields (%s); a rule matches one kind of traffic, so split it in two",
			strings.Join(httpFields, ", "), strings.Join(sqlFields, ", "))
	case len(httpFields) > 0:
		r.kind, r.fieldList = kindHTTP, strings.Join(httpFields, ", ")
	case len(sqlFields) > 0:
		r.kind, r.fieldList = kindSQL, strings.Join(sqlFields, ", ")
	}
	return nil
}

// compileHTTPMatch compiles the match's HTTP fields into r and names the
// fields it has.
func compileHTTPMatch(r *rule, m *fileMatch) (fields []string, err error) {
	if m.Host != nil {
		fields = append(fields, "host")
		if r.host, err = compileHost(*m.Host); err != nil {
			return nil, err
		}
	}
	if m.Port != nil {
		fields = append(fields, "port")
		if *m.Port < 1 || *m.Port > 65535 {
			return nil, fieldErr("match.port", "%d is outside 1-65535", *m.Port)
		}
		r.port = int(*m.Port)
	}
	if m.Scheme != nil {
		fields = append(fields, "scheme")
		s := strings.ToLower(*m.Scheme)
		if s != "http" && s != "https" {
			return nil, fieldErr("match.scheme", "%q is not http or https", *m.Scheme)
		}
		r.scheme = s
	}
	if m.Method.set {
		fields = append(fields, "method")
		if r.methods, err = compileMethods(m.Method.items); err != nil {
			return nil, err
		}
	}
	if m.Path != nil {
		fields = append(fields, "path")
		if r.path, err = compilePath(*m.Path); err != nil {
			return nil, fieldErr("match.path", "%v", err)
		}
	}
	if m.Header != nil {
		fields = append(fields, "header")
		if r.headers, err = compileHeaders(m.Header); err != nil {
			return nil, err
		}
	}
	return fields, nil
}

// compileHost compiles match.host: a host name or glob, or an IP literal
// (an IPv6 one with or without brackets), never a URL or a port.
func compileHost(host string) (*glob, error) {
	h := strings.TrimSuffix(host, ".")
	switch {
	case strings.Contains(h, "://") || strings.ContainsAny(h, "/ \t"):
		return nil, fieldErr("match.host", "%q is not a host name or glob (no scheme, path or spaces; those are fields of their own)", host)
	case strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") && net.ParseIP(h[1:len(h)-1]) != nil:
		h = h[1 : len(h)-1] // an IPv6 literal; requests are matched without brackets
	case strings.Contains(h, ":") && net.ParseIP(h) == nil:
		return nil, fieldErr("match.host", "%q has a port; use match.port", host)
	}
	g, err := compileGlob(h, true)
	if err != nil {
		return nil, fieldErr("match.host", "%v", err)
	}
	return g, nil
}

// compileMethods compiles match.method, upper-cased.
func compileMethods(items []string) ([]string, error) {
	if len(items) == 0 {
		return nil, fieldErr("match.method", "is an empty list; leave the key out to match any method")
	}
	var methods []string
	for _, meth := range items {
		up := strings.ToUpper(meth)
		if !slices.Contains(httpMethods, up) {
			return nil, fieldErr("match.method", "%q is not an HTTP method (one of %s)", meth, strings.Join(httpMethods, ", "))
		}
		methods = append(methods, up)
	}
	return methods, nil
}

// compileHeaders compiles match.header: a glob for each header's value,
// in the order of the names.
func compileHeaders(headers map[string]string) ([]headerMatch, error) {
	if len(headers) == 0 {
		return nil, fieldErr("match.header", "is empty; leave the key out to match any headers")
	}
	var out []headerMatch
	for _, name := range sortedKeys(headers) {
		if !isToken(name) {
			return nil, fieldErr("match.header", "%q is not a header name", name)
		}
		g, err := compileGlob(headers[name], false)
		if err != nil {
			if errors.Is(err, errEmptyPattern) {
				return nil, fieldErr("match.header."+name, "is empty; use \"*\" to match any value")
			}
			return nil, fieldErr("match.header."+name, "%v", err)
		}
		out = append(out, headerMatch{name: textproto.CanonicalMIMEHeaderKey(name), value: g})
	}
	return out, nil
}

// compileSQLMatch compiles the match's SQL fields into r and names the
// fields it has.
func compileSQLMatch(r *rule, m *fileMatch) (fields []string, err error) {
	if m.SQL.set {
		fields = append(fields, "sql")
		if r.sqlAny, r.sqlKinds, err = compileSQLKinds(m.SQL.items); err != nil {
			return nil, err
		}
	}
	if m.Tables.set {
		fields = append(fields, "tables")
		if len(m.Tables.items) == 0 {
			return nil, fieldErr("match.tables", "is an empty list; leave the key out to match any tables")
		}
		for _, t := range m.Tables.items {
			g, err := compileGlob(t, true)
			if err != nil {
				return nil, fieldErr("match.tables", "%v", err)
			}
			r.tables = append(r.tables, tablePattern{glob: g, qualified: strings.Contains(t, ".")})
		}
	}
	for _, f := range []struct {
		key string
		v   *string
		dst **glob
	}{{"database", m.Database, &r.database}, {"user", m.User, &r.user}, {"application_name", m.ApplicationName, &r.appName}} {
		if f.v == nil {
			continue
		}
		fields = append(fields, f.key)
		g, err := compileGlob(*f.v, false)
		if err != nil {
			return nil, fieldErr("match."+f.key, "%v", err)
		}
		*f.dst = g
	}
	return fields, nil
}

// compileSQLKinds compiles match.sql: any, or a set of statement kinds.
func compileSQLKinds(items []string) (matchAny bool, kinds uint32, err error) {
	if len(items) == 0 {
		return false, 0, fieldErr("match.sql", "is an empty list; use [any] to match every statement")
	}
	for _, k := range items {
		lk := strings.ToLower(k)
		if lk == KindAny {
			matchAny = true
			continue
		}
		bit, ok := sqlKindBits[lk]
		if !ok {
			return false, 0, fieldErr("match.sql", "%q is not a statement kind (one of any, %s)", k, strings.Join(SQLKinds(), ", "))
		}
		kinds |= bit
	}
	if matchAny {
		kinds = 0
	}
	return matchAny, kinds, nil
}

func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > MaxNameLen:
		return fmt.Errorf("is longer than %d bytes", MaxNameLen)
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	return nil
}

// isToken reports whether s is a valid HTTP header name (RFC 9110 token).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
