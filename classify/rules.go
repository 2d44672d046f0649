package classify

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/governor-project/governor/classify/sqlclass"
)

// Rules is a validated, compiled rule list. It is immutable once built, so
// one value may be matched from any number of goroutines; a reload builds a
// new Rules and swaps the pointer (see Watcher). A nil *Rules matches
// nothing.
type Rules struct {
	rules  []rule
	listed bool // the document had a rules: list (possibly empty)
}

// Decision is what the first matching rule yields.
//
// A Decision shares its Charges map and ChargeFromHeader with the Rules it
// came from, so that matching does not allocate: treat both as read-only.
type Decision struct {
	Rule    string // the rule's name; also the "rule" metrics label
	Class   string // the lease class to hold while the request or transaction runs; "" for none
	Charges map[string]int64
	// ChargeFromHeader, when not nil, asks for a charge after the response
	// arrives, of the number in one of its headers. See HeaderCharge.Amount.
	ChargeFromHeader *HeaderCharge
	// Meter, when not nil, meters the call's LLM tokens (see Meter).
	Meter *Meter
	// Bytes, when not nil, charges the bytes an HTTP request, its
	// response or a tunnel carries (see Bytes).
	Bytes *Bytes
	// Result, when not nil, charges the rows a SQL statement returns, or
	// their bytes (see Result).
	Result *Result
	// Read marks what the rule matches as reads, whatever the HTTP method,
	// so that a read-only tenant does not refuse it (a search by POST).
	Read bool
	// Shadow is a rule in dry run (mode: shadow): what it matches is asked
	// about, never charged or held, and always forwarded; a would-be
	// denial is logged and counted (docs/policy.md).
	Shadow bool
	// DenyRate (on_rate: deny) refuses what a rate has no room for at
	// once; by default (on_rate: wait) the sidecar paces it: it waits
	// until the rate has room, within its wait timeout.
	DenyRate bool
}

// WritesSQL reports whether a statement of these kinds may write, as a
// read-only tenant refuses: anything but a plain read, a transaction
// statement or a utility one (SET, SHOW, ...), unknown kinds included.
func WritesSQL(kinds []string) bool {
	for _, k := range kinds {
		switch k {
		case KindSelect, KindTransaction, KindUtility:
		default:
			return true
		}
	}
	return false
}

// WritesHTTP reports whether a request with this method is a write, as a
// read-only tenant refuses: any method but GET, HEAD and OPTIONS (CONNECT
// included: a tunnel may carry anything), unless the rule says read.
func WritesHTTP(method string, d Decision) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS":
		return false
	}
	return !d.Read
}

// HeaderCharge charges a resource, after the response, by the number the
// upstream put in a response header (e.g. the tokens an LLM call used).
type HeaderCharge struct {
	Resource string
	Header   string // canonical form, as http.Header keys are
}

// Errors from HeaderCharge.Amount. Neither charges anything: the caller
// counts and logs them (the request has already been served).
var (
	ErrHeaderMissing   = errors.New("the response has no such header")
	ErrHeaderNotNumber = errors.New("the response header is not a non-negative integer")
)

// Amount returns the amount to charge from the response header h. The value
// must be a decimal integer >= 0, with optional surrounding spaces; when the
// header repeats, the first value counts. A missing header returns
// ErrHeaderMissing and any other value ErrHeaderNotNumber (both wrapped, so
// use errors.Is); in either case nothing is to be charged. Zero is valid and
// means there is nothing to charge.
func (c *HeaderCharge) Amount(h http.Header) (int64, error) {
	vs := h[c.Header]
	if len(vs) == 0 {
		return 0, fmt.Errorf("charge %s from %s: %w", c.Resource, c.Header, ErrHeaderMissing)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(vs[0]), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("charge %s from %s: %q: %w", c.Resource, c.Header, vs[0], ErrHeaderNotNumber)
	}
	return n, nil
}

// String describes the decision for logs and `governor explain`, e.g.
//
//	rule "llm": class llm; charge llm_calls=1; after the response, charge tokens from header X-Usage-Tokens
func (d Decision) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rule %q: ", d.Rule)
	if d.Class == "" {
		b.WriteString("no lease")
	} else {
		fmt.Fprintf(&b, "class %s", d.Class)
	}
	if len(d.Charges) == 0 {
		b.WriteString("; no charge")
	} else {
		b.WriteString("; charge ")
		for i, r := range sortedKeys(d.Charges) {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s=%d", r, d.Charges[r])
		}
	}
	if c := d.ChargeFromHeader; c != nil {
		fmt.Fprintf(&b, "; after the response, charge %s from header %s", c.Resource, c.Header)
	}
	if m := d.Meter; m != nil {
		b.WriteString("; " + m.String())
	}
	if by := d.Bytes; by != nil {
		b.WriteString("; " + by.String())
	}
	if r := d.Result; r != nil {
		b.WriteString("; " + r.String())
	}
	return b.String()
}

// HTTPRequest is what an HTTP rule looks at.
type HTTPRequest struct {
	Scheme string // "http" or "https"; "" when unknown (a CONNECT tunnel)
	Host   string // a name or an IP, with or without ":port"; matched case-insensitively
	Port   string // "" means the port in Host, else the scheme's default
	Method string
	// Path is the decoded URL path (url.URL.Path), without the query. Empty
	// means "/", except for CONNECT, where it means "unknown" and no rule
	// with a path matches.
	Path   string
	Header http.Header // looked up by canonical key, as Header.Get does
}

// HTTPRequestFrom builds the HTTPRequest for r as a forward proxy receives
// it: an absolute URL for plain HTTP, host:port for CONNECT. It does not
// allocate.
func HTTPRequestFrom(r *http.Request) HTTPRequest {
	q := HTTPRequest{Method: r.Method, Header: r.Header}
	if r.URL != nil {
		q.Scheme, q.Host, q.Path = r.URL.Scheme, r.URL.Host, r.URL.Path
	}
	if q.Host == "" {
		q.Host = r.Host
	}
	return q
}

// SQLStatement is what a SQL rule looks at: one statement. A message that
// holds several is matched statement by statement.
type SQLStatement struct {
	// Kinds are the statement kinds (the Kind* constants). A read that
	// writes (a data-modifying WITH, INSERT ... ON CONFLICT DO UPDATE, a
	// SELECT calling a function) has several; a rule's sql list matches
	// when it shares any kind with them.
	Kinds []string
	// Tables are the tables named, as written, unquoted and folded to lower
	// case where SQL folds them; qualified names keep their schema
	// ("public.payments").
	Tables          []string
	Database        string
	User            string
	ApplicationName string
}

// Statement kinds, as the sql field of a rule names them: the classifier's
// own (package sqlclass), and "any".
const (
	KindSelect      = sqlclass.KindSelect
	KindInsert      = sqlclass.KindInsert
	KindUpdate      = sqlclass.KindUpdate
	KindDelete      = sqlclass.KindDelete
	KindMerge       = sqlclass.KindMerge
	KindCopy        = sqlclass.KindCopy
	KindTruncate    = sqlclass.KindTruncate
	KindLock        = sqlclass.KindLock
	KindCall        = sqlclass.KindCall
	KindDo          = sqlclass.KindDo
	KindFunction    = sqlclass.KindFunction
	KindDDL         = sqlclass.KindDDL
	KindTransaction = sqlclass.KindTransaction
	KindUtility     = sqlclass.KindUtility
	// KindUnknown: see sqlclass.KindUnknown. Rules that name unknown, and
	// sql: any, match it.
	KindUnknown = sqlclass.KindUnknown
	KindAny     = "any" // in rules only: every statement
)

// sqlKindOrder is the canonical order of the kinds; a kind's bit in a
// rule's sqlKinds mask is its index here.
var sqlKindOrder = sqlclass.Kinds()

var sqlKindBits = func() map[string]uint32 {
	m := make(map[string]uint32, len(sqlKindOrder))
	for i, k := range sqlKindOrder {
		m[k] = 1 << i
	}
	return m
}()

// SQLKinds lists the statement kinds a rule may name (besides "any"), in
// their canonical order.
func SQLKinds() []string { return sqlclass.Kinds() }

type ruleKind uint8

const (
	kindEverything ruleKind = iota // an empty match
	kindHTTP
	kindSQL
)

type rule struct {
	kind     ruleKind
	decision Decision

	// HTTP; a zero value means "any".
	host    *glob
	port    int
	scheme  string
	methods []string // upper case
	path    *pathPattern
	headers []headerMatch

	// SQL; a zero value means "any".
	sqlKinds  uint32 // 0: no sql field, or sql: any
	sqlAny    bool
	tables    []tablePattern
	database  *glob
	user      *glob
	appName   *glob
	fieldList string // the match fields given, for explanations
}

type headerMatch struct {
	name  string // canonical
	value *glob
}

// tablePattern matches a table name. A pattern with a "." is matched against
// the name as the statement gives it; one without, against the part after
// the last ".".
type tablePattern struct {
	glob      *glob
	qualified bool
}

func (t tablePattern) match(name string) bool {
	if !t.qualified {
		if i := strings.LastIndexByte(name, '.'); i >= 0 {
			name = name[i+1:]
		}
	}
	return t.glob.match(name)
}

// Len returns the number of rules.
func (rs *Rules) Len() int {
	if rs == nil {
		return 0
	}
	return len(rs.rules)
}

// Names returns the rules' names in order, e.g. to pre-register metrics.
func (rs *Rules) Names() []string {
	var out []string
	for i := range rs.rulesOrNil() {
		out = append(out, rs.rules[i].decision.Rule)
	}
	return out
}

// Decisions returns what each rule yields, in order.
func (rs *Rules) Decisions() []Decision {
	var out []Decision
	for i := range rs.rulesOrNil() {
		out = append(out, rs.rules[i].decision)
	}
	return out
}

func (rs *Rules) rulesOrNil() []rule {
	if rs == nil {
		return nil
	}
	return rs.rules
}

// MatchHTTP returns the decision of the first rule that matches req, and
// false when none does. In the common case it does not allocate.
func (rs *Rules) MatchHTTP(req HTTPRequest) (Decision, bool) {
	q := normalizeHTTP(&req)
	for i := range rs.rulesOrNil() {
		r := &rs.rules[i]
		if ok, _ := r.matchHTTP(&q, false); ok {
			return r.decision, true
		}
	}
	return Decision{}, false
}

// MatchSQL returns the decision of the first rule that matches st, and false
// when none does. It does not allocate.
func (rs *Rules) MatchSQL(st SQLStatement) (Decision, bool) {
	for i := range rs.rulesOrNil() {
		r := &rs.rules[i]
		if ok, _ := r.matchSQL(&st, false); ok {
			return r.decision, true
		}
	}
	return Decision{}, false
}

// MatchSQLConnection matches a statement by what its connection alone says
// (database, user, application_name; st's Kinds and Tables are ignored), so
// that a proxy need not classify statements the rules cannot tell apart,
// such as every statement under a rule of `sql: any`. decided is false when
// a rule that could match needs the statement's kinds or tables: then
// classify the statement and call MatchSQL. The answer depends only on the
// rules and the connection, so a caller may keep it for as long as both.
func (rs *Rules) MatchSQLConnection(st SQLStatement) (d Decision, ok, decided bool) {
	for i := range rs.rulesOrNil() {
		r := &rs.rules[i]
		if r.kind == kindHTTP {
			continue
		}
		if r.sqlKinds != 0 || r.tables != nil {
			return Decision{}, false, false
		}
		if ok, _ := r.matchSQL(&st, false); ok {
			return r.decision, true, true
		}
	}
	return Decision{}, false, true
}

// httpReq is an HTTPRequest made ready for matching.
type httpReq struct {
	scheme  string
	host    string // without port, brackets or a trailing dot
	port    int    // 0: unknown
	method  string
	path    string // cleaned; "" when unknown
	header  http.Header
	portSrc string // as given, for explanations
}

func normalizeHTTP(r *HTTPRequest) httpReq {
	q := httpReq{scheme: r.Scheme, method: r.Method, header: r.Header}
	host, port := splitHostPort(r.Host)
	if r.Port != "" {
		port = r.Port
	}
	q.host = strings.TrimSuffix(host, ".")
	q.portSrc = port
	if port != "" {
		if n, err := strconv.Atoi(port); err == nil && n > 0 && n <= 65535 {
			q.port = n
		}
	} else {
		switch {
		case strings.EqualFold(r.Scheme, "http"):
			q.port = 80
		case strings.EqualFold(r.Scheme, "https"):
			q.port = 443
		}
	}
	switch {
	case r.Path != "":
		q.path = cleanPath(r.Path)
	case !strings.EqualFold(r.Method, http.MethodConnect):
		q.path = "/"
	}
	return q
}

// splitHostPort splits "host:port", "[v6]:port", "[v6]" or a bare host; a
// bare IPv6 address (several colons, no brackets) has no port.
func splitHostPort(hp string) (host, port string) {
	if strings.HasPrefix(hp, "[") {
		if end := strings.IndexByte(hp, ']'); end > 0 {
			host, rest := hp[1:end], hp[end+1:]
			if strings.HasPrefix(rest, ":") {
				return host, rest[1:]
			}
			return host, ""
		}
		return hp, ""
	}
	if i := strings.IndexByte(hp, ':'); i >= 0 && strings.LastIndexByte(hp, ':') == i {
		return hp[:i], hp[i+1:]
	}
	return hp, ""
}

// matchHTTP reports whether r matches q. With why set it also says, when it
// does not, which field failed; without, it builds no strings, so that the
// hot path does not allocate.
func (r *rule) matchHTTP(q *httpReq, why bool) (bool, string) {
	if r.kind == kindSQL {
		if why {
			return false, "a SQL rule (it has " + r.fieldList + "); never matches HTTP"
		}
		return false, ""
	}
	if r.host != nil && !r.host.match(q.host) {
		if why {
			return false, fmt.Sprintf("match.host: %q does not match %q", q.host, r.host.src)
		}
		return false, ""
	}
	if r.port != 0 && q.port != r.port {
		if why {
			if q.port == 0 {
				return false, fmt.Sprintf("match.port: the request's port is unknown (%q), not %d", q.portSrc, r.port)
			}
			return false, fmt.Sprintf("match.port: %d is not %d", q.port, r.port)
		}
		return false, ""
	}
	if r.scheme != "" && !strings.EqualFold(q.scheme, r.scheme) {
		if why {
			return false, fmt.Sprintf("match.scheme: %q is not %s", q.scheme, r.scheme)
		}
		return false, ""
	}
	if r.methods != nil && !r.methodMatches(q.method) {
		if why {
			return false, fmt.Sprintf("match.method: %q is not %s", q.method, strings.Join(r.methods, " or "))
		}
		return false, ""
	}
	if r.path != nil && (q.path == "" || !r.path.match(q.path)) {
		if why {
			if q.path == "" {
				return false, "match.path: the path of a CONNECT tunnel is unknown"
			}
			return false, fmt.Sprintf("match.path: %q does not match %q", q.path, r.path.src)
		}
		return false, ""
	}
	for i := range r.headers {
		h := &r.headers[i]
		if !h.matches(q.header) {
			if why {
				if len(q.header[h.name]) == 0 {
					return false, fmt.Sprintf("match.header: %s is missing", h.name)
				}
				return false, fmt.Sprintf("match.header: %s %q does not match %q", h.name, q.header[h.name], h.value.src)
			}
			return false, ""
		}
	}
	return yes(why, r)
}

func (r *rule) methodMatches(m string) bool {
	for _, want := range r.methods {
		if strings.EqualFold(m, want) {
			return true
		}
	}
	return false
}

func (h *headerMatch) matches(hdr http.Header) bool {
	for _, v := range hdr[h.name] {
		if h.value.match(v) {
			return true
		}
	}
	return false
}

func (r *rule) matchSQL(st *SQLStatement, why bool) (bool, string) {
	if r.kind == kindHTTP {
		if why {
			return false, "an HTTP rule (it has " + r.fieldList + "); never matches SQL"
		}
		return false, ""
	}
	if r.sqlKinds != 0 && !r.kindMatches(st.Kinds) {
		if why {
			return false, fmt.Sprintf("match.sql: %s shares no kind with %s", kindList(st.Kinds), bitsToKinds(r.sqlKinds))
		}
		return false, ""
	}
	if r.tables != nil && !r.tableMatches(st.Tables) {
		if why {
			pats := make([]string, len(r.tables))
			for i, t := range r.tables {
				pats[i] = t.glob.src
			}
			return false, fmt.Sprintf("match.tables: no table of %s matches %s", kindList(st.Tables), strings.Join(pats, ", "))
		}
		return false, ""
	}
	for _, f := range [...]struct {
		name string
		g    *glob
		v    string
	}{{"database", r.database, st.Database}, {"user", r.user, st.User}, {"application_name", r.appName, st.ApplicationName}} {
		if f.g != nil && !f.g.match(f.v) {
			if why {
				return false, fmt.Sprintf("match.%s: %q does not match %q", f.name, f.v, f.g.src)
			}
			return false, ""
		}
	}
	return yes(why, r)
}

func (r *rule) kindMatches(kinds []string) bool {
	for _, k := range kinds {
		if sqlKindBits[k]&r.sqlKinds != 0 {
			return true
		}
	}
	return false
}

func (r *rule) tableMatches(tables []string) bool {
	for _, name := range tables {
		for _, t := range r.tables {
			if t.match(name) {
				return true
			}
		}
	}
	return false
}

func yes(why bool, r *rule) (bool, string) {
	if !why {
		return true, ""
	}
	if r.kind == kindEverything {
		return true, "its match is empty, so it matches everything"
	}
	return true, "every field matches: " + r.fieldList
}

func kindList(s []string) string {
	if len(s) == 0 {
		return "[]"
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func bitsToKinds(bits uint32) string {
	var out []string
	for i, k := range sqlKindOrder {
		if bits&(1<<i) != 0 {
			out = append(out, k)
		}
	}
	return kindList(out)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
