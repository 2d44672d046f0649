package sqlclass

import (
	"github.com/governor-project/governor/classify"
)

// Class is what the classifier finds in one Query or Parse: the statement
// kinds (classify's Kind* names, in their canonical order) and the tables
// named, both unions over every statement in the text. A Class from the
// cache is shared: treat it as read-only.
type Class struct {
	Kinds  []string
	Tables []string
	// Prepares lists the SQL-level PREPARE statements in the text, so that a
	// later EXECUTE of that name on the same connection is classified as
	// the prepared statement.
	Prepares []PreparedSQL
	// Executes lists the names run with SQL-level EXECUTE.
	Executes []string
}

// Executing is c with the statements its SQL-level EXECUTEs run folded in:
// prepared returns the Class a name was prepared with on the connection
// (nil when unknown). An EXECUTE alone is what it runs.
func (c *Class) Executing(prepared func(name string) *Class) *Class {
	if len(c.Executes) == 0 {
		return c
	}
	merged := &Class{Kinds: c.Kinds, Tables: c.Tables}
	var set kindSet
	for _, k := range c.Kinds {
		set |= kindBit(k)
	}
	for _, name := range c.Executes {
		if p := prepared(name); p != nil {
			for _, k := range p.Kinds {
				set |= kindBit(k)
			}
			merged.Tables = append(merged.Tables[:len(merged.Tables):len(merged.Tables)], p.Tables...)
		}
	}
	if len(c.Kinds) == 1 && set != kUtility {
		set &^= kUtility
	}
	merged.Kinds = kindLists[set]
	return merged
}

func kindBit(name string) kindSet {
	for i, n := range kindNames {
		if n == name {
			return 1 << i
		}
	}
	return 0
}

// PreparedSQL is a statement prepared with SQL's PREPARE name AS ....
type PreparedSQL struct {
	Name  string
	Class *Class
}

// kind bits, in classify.SQLKinds order.
type kindSet uint16

const (
	kSelect kindSet = 1 << iota
	kInsert
	kUpdate
	kDelete
	kMerge
	kCopy
	kTruncate
	kLock
	kCall
	kDo
	kDDL
	kTransaction
	kUtility
	kindCount = iota
)

// kindNames are classify's kinds, in the order the bits above follow
// (TestClassifySQL catches a bit that names the wrong kind).
var kindNames = func() (n [kindCount]string) {
	kinds := classify.SQLKinds()
	if len(kinds) != kindCount {
		panic("sqlclass: the kind bits do not match classify.SQLKinds")
	}
	copy(n[:], kinds)
	return n
}()

// kindLists interns the kind lists, so a Class holds a shared slice.
var kindLists = func() (l [1 << kindCount][]string) {
	for set := range l {
		for i, name := range kindNames {
			if set&(1<<i) != 0 {
				l[set] = append(l[set], name)
			}
		}
	}
	return l
}()

const dmlKinds = kInsert | kUpdate | kDelete | kMerge

// ClassifySQL classifies the statements in sql. It never fails: text it
// cannot make sense of is a utility statement, which the server will most
// likely reject anyway.
func Classify(sql string) *Class {
	var c classifier
	c.toks = lex(sql, make([]token, 0, 32))
	start := 0
	for start < len(c.toks) {
		end := stmtEnd(c.toks, start)
		c.statement(start, end)
		start = end + 1
	}
	return &Class{Kinds: kindLists[c.kinds], Tables: c.tables, Prepares: c.prepares, Executes: c.executes}
}

// stmtEnd returns the index of the semicolon that ends the statement
// starting at start (or len(toks)). Semicolons inside parentheses, and
// inside a CREATE FUNCTION's BEGIN ATOMIC ... END body, do not end it.
func stmtEnd(toks []token, start int) int {
	depth, atomic, cases := 0, false, 0
	for i := start; i < len(toks); i++ {
		t := toks[i]
		switch t.kind {
		case tokLParen:
			depth++
		case tokRParen:
			if depth > 0 {
				depth--
			}
		case tokSemi:
			if depth == 0 && !atomic {
				return i
			}
		case tokIdent:
			switch {
			case t.text == "atomic" && i > start && toks[i-1].is("begin") && toks[start].is("create"):
				atomic = true
			case atomic && t.text == "case":
				cases++
			case atomic && t.text == "end":
				if cases > 0 {
					cases--
				} else {
					atomic = false
				}
			}
		}
	}
	return len(toks)
}

type classifier struct {
	toks     []token
	kinds    kindSet
	tables   []string
	ctes     []string
	prepares []PreparedSQL
	executes []string
}

func (c *classifier) at(i int) token {
	if i < len(c.toks) && i >= 0 {
		return c.toks[i]
	}
	return token{kind: tokSemi}
}

// statement classifies toks[start:end], one statement.
func (c *classifier) statement(start, end int) {
	if start >= end {
		return
	}
	c.ctes = c.ctes[:0]
	k := c.kindOf(start, end)
	c.kinds |= k
	c.scanTables(start, end, k)
}

// kindOf returns the kinds of the statement toks[start:end]. It looks at the
// leading keyword and, where a read can write, further.
func (c *classifier) kindOf(start, end int) kindSet {
	lead := start
	for lead < end && c.toks[lead].kind == tokLParen { // (SELECT ...) UNION ...
		lead++
	}
	if lead > start {
		if lead == end {
			return kUtility
		}
		return c.kindOf(lead, end)
	}
	t := c.at(start)
	if t.kind != tokIdent {
		return kUtility
	}
	switch t.text {
	case "select", "values", "table":
		k := kSelect | c.lockingClause(start, end)
		if t.text == "select" && c.selectInto(start, end) {
			k |= kDDL
		}
		return k | c.modifyingCTEs(start, end)
	case "with":
		main := c.withMain(start, end)
		k := c.modifyingCTEs(start, end)
		if main < end {
			mk := c.kindOf(main, end)
			if k != 0 {
				mk &^= kSelect // a WITH that writes is not a read
			}
			k |= mk
		}
		if k == 0 {
			k = kSelect
		}
		return k
	case "insert":
		k := kInsert | c.modifyingCTEs(start, end)
		if c.onConflictUpdate(start, end) {
			k |= kUpdate
		}
		return k
	case "update":
		return kUpdate | c.modifyingCTEs(start, end)
	case "delete":
		return kDelete | c.modifyingCTEs(start, end)
	case "merge":
		return kMerge | c.modifyingCTEs(start, end)
	case "copy":
		k := kCopy
		if c.at(start+1).kind == tokLParen {
			k |= c.kindOf(start+2, matchParen(c.toks, start+1, end)) & (dmlKinds | kLock)
		}
		return k
	case "truncate":
		return kTruncate
	case "lock":
		return kLock
	case "call":
		return kCall
	case "do":
		return kDo
	case "explain":
		return c.explain(start, end)
	case "declare":
		// DECLARE c CURSOR FOR query: the query's kinds.
		for i := start + 1; i < end; i++ {
			if c.toks[i].is("for") {
				return c.kindOf(i+1, end)
			}
		}
		return kUtility
	case "prepare":
		if c.at(start + 1).is("transaction") {
			return kTransaction
		}
		c.prepare(start, end)
		return kUtility
	case "execute":
		if n := c.at(start + 1); n.kind == tokIdent || n.kind == tokQIdent {
			c.executes = append(c.executes, n.text)
		}
		return kUtility
	case "begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release":
		return kTransaction
	case "set":
		if c.at(start+1).is("transaction") || (c.at(start+1).is("session") && c.at(start+2).is("characteristics")) {
			return kTransaction
		}
		return kUtility
	case "create", "alter", "drop", "comment", "grant", "revoke", "security", "refresh", "import", "reassign":
		return kDDL
	}
	return kUtility
}

// lockingClause returns kLock when a SELECT has FOR UPDATE / NO KEY UPDATE /
// SHARE / KEY SHARE anywhere in it.
func (c *classifier) lockingClause(start, end int) kindSet {
	for i := start; i < end-1; i++ {
		if !c.toks[i].is("for") {
			continue
		}
		n := c.toks[i+1]
		if n.is("update") || n.is("share") || (n.is("no") && c.at(i+2).is("key")) || (n.is("key") && c.at(i+2).is("share")) {
			return kLock
		}
	}
	return 0
}

// selectInto reports a top-level SELECT ... INTO table, which creates it.
func (c *classifier) selectInto(start, end int) bool {
	depth := 0
	for i := start; i < end; i++ {
		switch t := c.toks[i]; {
		case t.kind == tokLParen:
			depth++
		case t.kind == tokRParen:
			depth--
		case depth == 0 && t.is("into"):
			return true
		}
	}
	return false
}

// modifyingCTEs returns the DML kinds of parenthesized statements (a WITH's
// data-modifying CTEs, at any depth).
func (c *classifier) modifyingCTEs(start, end int) kindSet {
	var k kindSet
	for i := start; i < end-1; i++ {
		if c.toks[i].kind != tokLParen {
			continue
		}
		switch n := c.toks[i+1]; {
		case n.is("insert"):
			k |= kInsert
		case n.is("update"):
			k |= kUpdate
		case n.is("delete"):
			k |= kDelete
		case n.is("merge"):
			k |= kMerge
		}
	}
	return k
}

// withMain skips a WITH list and returns the index of the main statement.
// It also records the CTE names, which are not tables.
func (c *classifier) withMain(start, end int) int {
	i := start + 1
	if c.at(i).is("recursive") {
		i++
	}
	for i < end {
		// name [(cols)] AS [NOT] [MATERIALIZED] ( body ) [SEARCH ...] [CYCLE ...]
		if t := c.at(i); t.kind == tokIdent || t.kind == tokQIdent {
			c.ctes = append(c.ctes, t.text)
		}
		i++
		if c.at(i).kind == tokLParen { // a column list
			i = matchParen(c.toks, i, end) + 1
		}
		for i < end && c.toks[i].kind == tokIdent { // AS [NOT] [MATERIALIZED]
			i++
		}
		if i >= end || c.toks[i].kind != tokLParen {
			return i
		}
		i = matchParen(c.toks, i, end) + 1 // past the body
		depth := 0
		for ; i < end; i++ {
			t := c.toks[i]
			if t.kind == tokLParen {
				depth++
			} else if t.kind == tokRParen {
				depth--
			} else if depth == 0 && (t.kind == tokComma || isMainKeyword(t)) {
				break
			}
		}
		if i >= end || c.toks[i].kind != tokComma {
			return i
		}
		i++
	}
	return end
}

func isMainKeyword(t token) bool {
	if t.kind != tokIdent {
		return false
	}
	switch t.text {
	case "select", "insert", "update", "delete", "merge", "values", "table":
		return true
	}
	return false
}

func (c *classifier) onConflictUpdate(start, end int) bool {
	for i := start; i < end-3; i++ {
		if c.toks[i].is("on") && c.toks[i+1].is("conflict") {
			for j := i + 2; j < end-1; j++ {
				if c.toks[j].is("do") && c.toks[j+1].is("update") {
					return true
				}
			}
		}
	}
	return false
}

// explain: EXPLAIN runs its statement only with ANALYZE, and then has the
// statement's kinds; otherwise it is a utility.
func (c *classifier) explain(start, end int) kindSet {
	i, analyze := start+1, false
	for i < end {
		t := c.toks[i]
		if t.is("analyze") || t.is("analyse") {
			analyze = true
			i++
			continue
		}
		if t.is("verbose") {
			i++
			continue
		}
		if t.kind == tokLParen {
			close := matchParen(c.toks, i, end)
			for j := i + 1; j < close; j++ {
				if c.toks[j].is("analyze") || c.toks[j].is("analyse") {
					n := c.at(j + 1)
					analyze = !n.is("false") && !n.is("off")
				}
			}
			i = close + 1
			continue
		}
		break
	}
	if !analyze {
		return kUtility
	}
	return c.kindOf(i, end)
}

func (c *classifier) prepare(start, end int) {
	name := c.at(start + 1)
	if name.kind != tokIdent && name.kind != tokQIdent {
		return
	}
	for i := start + 2; i < end; i++ {
		if c.toks[i].is("as") {
			inner := classifier{toks: c.toks}
			inner.statement(i+1, end)
			c.prepares = append(c.prepares, PreparedSQL{Name: name.text,
				Class: &Class{Kinds: kindLists[inner.kinds], Tables: inner.tables}})
			return
		}
	}
}

// matchParen returns the index of the ')' matching the '(' at i, or end-1
// when it is not closed before end.
func matchParen(toks []token, i, end int) int {
	depth := 0
	for j := i; j < end; j++ {
		switch toks[j].kind {
		case tokLParen:
			depth++
		case tokRParen:
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return end - 1
}
