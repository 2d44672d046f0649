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
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/internal/configfile"
)

// Limits on what a rule file may hold.
const (
	// MaxFileSize bounds a rule file that Load or a Watcher reads.
	MaxFileSize = 4 << 20
	// MaxNameLen matches the engine's bound on names (rules, classes,
	// resources), so a rule that validates here is not refused later.
	MaxNameLen = 256
)

// Error is a rule file that fails to load: the one config error of all
// Governor's files (package configfile). Its Key names the key at fault and
// its Item the rule by name, e.g.
//
//	config: rules[2].match.method (rule "writes"): "FETCH" is not an HTTP method
//
// Parse, Load and a Watcher's reload return the first problem they find as an
// *Error; the file is then rejected as a whole.
type Error = configfile.Error

// The file's shape, kept apart from the compiled rules so that what YAML
// allows (absent vs empty, one method or a list) and what matching runs on
// can differ. Every key is strict: package configfile refuses one not
// listed here.
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
	Bytes            *fileBytes         `yaml:"bytes"`
	Result           *fileResult        `yaml:"result"`
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
// configfile), and an error shows a reference rather than the value it
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
	doc, err := configfile.Parse(text)
	if err != nil {
		return nil, err
	}
	rs, err := parseRules(doc)
	// A value that came from ${VAR} is shown as its reference, never as
	// what it expanded to, which may be a secret.
	return rs, doc.Redact(err)
}

func parseRules(doc *configfile.Document) (*Rules, error) {
	if doc.Empty() {
		return nil, &Error{Key: configfile.FileKey, Problem: "the document is empty"}
	}
	if doc.Root().Kind != yaml.MappingNode {
		return nil, &Error{Key: configfile.FileKey, Problem: "the document is not a mapping of keys to values"}
	}
	rulesNode := doc.Lookup("rules")
	if rulesNode == nil {
		return &Rules{}, nil
	}
	if rulesNode.Kind != yaml.SequenceNode {
		return nil, &Error{Key: "rules", Problem: fmt.Sprintf("line %d: is not a list of rules", rulesNode.Line)}
	}
	rs := &Rules{rules: make([]rule, 0, len(rulesNode.Content)), listed: true}
	seen := map[string]int{}
	for i, n := range rulesNode.Content {
		n = resolve(n)
		key, name := fmt.Sprintf("rules[%d]", i), peekName(n)
		if n.Kind != yaml.MappingNode {
			return nil, &Error{Key: key, Problem: fmt.Sprintf("line %d: is not a mapping of keys to values", n.Line)}
		}
		var fr fileRule
		if err := configfile.Decode(n, "", &fr); err != nil {
			return nil, ruleErr(key, name, err)
		}
		r, err := compileRule(&fr)
		if err != nil {
			return nil, ruleErr(key, name, err)
		}
		if j, dup := seen[r.decision.Rule]; dup {
			return nil, ruleErr(key, name, fieldErr("name", "%q is the name of rules[%d] too; names are unique", r.decision.Rule, j))
		}
		seen[r.decision.Rule] = i
		rs.rules = append(rs.rules, r)
	}
	return rs, nil
}

// ruleErr is err, about a key of the rule at key, as an *Error naming the
// whole key and the rule.
func ruleErr(key, name string, err error) error {
	e := &Error{Key: key, Problem: err.Error()}
	var fe *fieldError
	var ce *Error
	switch {
	case errors.As(err, &fe):
		e.Problem = fe.problem
		if fe.field != "" {
			e.Key += "." + fe.field
		}
	case errors.As(err, &ce):
		e.Problem = ce.Problem
		if ce.Key != configfile.FileKey && ce.Key != "" {
			e.Key += "." + ce.Key
		}
	}
	if name != "" {
		e.Item = fmt.Sprintf("rule %q", name)
	}
	return e
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
	if err := compileCharges(&r, fr); err != nil {
		return r, err
	}
	if err := compileModes(&r, fr); err != nil {
		return r, err
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
	if fr.Match != nil { // no match: matches everything, like match: {}
		if err := compileMatch(&r, fr.Match); err != nil {
			return r, err
		}
	}
	return r, compileTraffic(&r, fr)
}

// compileCharges checks and copies the rule's fixed charges.
func compileCharges(r *rule, fr *fileRule) error {
	for _, res := range sortedKeys(fr.Charge) {
		if err := checkName(res); err != nil {
			return fieldErr("charge", "a resource name %v", err)
		}
		if amt := fr.Charge[res]; amt <= 0 {
			return fieldErr("charge."+res, "%d is not a positive amount", amt)
		}
	}
	if len(fr.Charge) > 0 {
		r.decision.Charges = make(map[string]int64, len(fr.Charge))
		for res, amt := range fr.Charge {
			r.decision.Charges[res] = int64(amt)
		}
	}
	return nil
}

// compileModes reads how the rule's requests are decided: read (not
// writes), mode (enforce or shadow) and on_rate (wait or deny).
func compileModes(r *rule, fr *fileRule) error {
	if fr.Read != nil {
		r.decision.Read = *fr.Read
	}
	if fr.Mode != nil {
		switch *fr.Mode {
		case "enforce":
		case "shadow":
			r.decision.Shadow = true
		default:
			return fieldErr("mode", "%q is not enforce or shadow", *fr.Mode)
		}
	}
	if fr.OnRate != nil {
		switch *fr.OnRate {
		case "wait":
		case "deny":
			r.decision.DenyRate = true
		default:
			return fieldErr("on_rate", "%q is not wait or deny", *fr.OnRate)
		}
	}
	return nil
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
