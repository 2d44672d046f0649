package sqlclass

import (
	"sync"
)

// Limits of the classifier. A statement past one of them is of kind
// unknown, with no tables; text past MaxStatements ends in one unknown
// entry that counts the statements left. Within them, classification takes
// time linear in the text and memory bounded by the limits, whatever the
// text's size.
const (
	// MaxDepth bounds nesting: open parentheses plus the statements nested
	// in EXPLAIN, DECLARE ... FOR, COPY (...), PREPARE ... AS and WITH.
	MaxDepth = 256
	// MaxNames bounds the distinct table and CTE names kept for one text.
	MaxNames = 1024
	// MaxStatements bounds a Class's entries (identical statements in a row
	// share one, with a Count).
	MaxStatements = 1024
	// nameLen is PostgreSQL's NAMEDATALEN-1: it truncates longer
	// identifiers, and so does this package.
	nameLen = 63
	// maxNameParts: a relation's name has at most three parts.
	maxNameParts = 3
)

// Class is what the classifier finds in a text (a Query's or a Parse's):
// its statements, in order. A Class from a Cache is shared: treat it as
// read-only.
type Class struct {
	Statements []Statement
	one        [1]Statement // the backing of most texts' one statement
}

// Statement is one SQL statement, or several identical ones in a row.
type Statement struct {
	// Kinds are classify's Kind* names, in their canonical order. A read that
	// writes (a data-modifying WITH, ON CONFLICT DO UPDATE, SELECT INTO) has
	// several. Nil for an EXECUTE until Executing resolves it.
	Kinds []string
	// Tables are the tables named, as written, unquoted and folded to lower
	// case where SQL folds them; qualified names keep their schema.
	Tables []string
	// Count is how many identical statements in a row this entry stands
	// for: each of them runs, so each is charged.
	Count int
	// Execute names the prepared statement this statement runs (EXECUTE
	// name, EXPLAIN ANALYZE EXECUTE name, CREATE TABLE ... AS EXECUTE name):
	// its kinds and tables are those of whatever the connection has prepared
	// under that name when it runs (Executing).
	Execute string
	// Op is what the statement does to the connection's prepared
	// statements, with Name and, for OpPrepare, Prepared.
	Op       Op
	Name     string
	Prepared *Statement

	set kindSet // Kinds as bits
}

// Op is a change to a connection's prepared statements.
type Op uint8

// The changes. Protocol-level Parse and Close change the same namespace;
// the proxy follows those itself.
const (
	OpNone          Op = iota
	OpPrepare          // PREPARE Name AS Prepared
	OpDeallocate       // DEALLOCATE [PREPARE] Name
	OpDeallocateAll    // DEALLOCATE [PREPARE] ALL
	OpDiscardAll       // DISCARD ALL, which deallocates all too
)

// Unknown is a statement the classifier cannot see into: its kind is
// unknown and it names no table.
var Unknown = Statement{Kinds: kindLists[kUnknown], Count: 1, set: kUnknown}

// FunctionCall is the statement of the protocol's FunctionCall message.
var FunctionCall = Statement{Kinds: kindLists[kFunction], Count: 1, set: kFunction}

// Executing returns s as it runs when prepared is what its Execute names
// (nil when the name is not prepared, which makes it Unknown): the kinds and
// tables of both. A statement that executes nothing is returned as it is.
func (s *Statement) Executing(prepared *Statement) Statement {
	if s.Execute == "" {
		return *s
	}
	if prepared == nil {
		u := Unknown
		u.Count = s.Count
		return u
	}
	r := Statement{Count: s.Count, set: s.set | prepared.set}
	if r.set&kUnknown != 0 {
		r.set = kUnknown
	}
	r.Kinds = kindLists[r.set]
	if r.set != kUnknown {
		r.Tables = s.Tables
		for _, t := range prepared.Tables {
			if !contains(r.Tables, t) {
				r.Tables = append(r.Tables[:len(r.Tables):len(r.Tables)], t)
			}
		}
	}
	return r
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// kind bits, in the canonical order (Kinds).
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
	kFunction
	kDDL
	kTransaction
	kUtility
	kUnknown
	kindCount = iota
)

const dmlKinds = kInsert | kUpdate | kDelete | kMerge

// The kinds of statement the classifier tells apart: the values a rule's
// sql: list names (package classify), and what a Statement's Kinds holds.
const (
	KindSelect      = "select"      // SELECT, VALUES, TABLE, a WITH that only reads
	KindInsert      = "insert"      // INSERT, also inside a WITH
	KindUpdate      = "update"      // UPDATE, also inside a WITH
	KindDelete      = "delete"      // DELETE, also inside a WITH
	KindMerge       = "merge"       // MERGE
	KindCopy        = "copy"        // COPY, either direction
	KindTruncate    = "truncate"    // TRUNCATE
	KindLock        = "lock"        // SELECT ... FOR UPDATE/SHARE, LOCK TABLE
	KindCall        = "call"        // CALL: a procedure may write anything
	KindDo          = "do"          // DO: an anonymous block may write anything
	KindFunction    = "function"    // a call of a function not known to only read (nextval, a user's); the FunctionCall message
	KindDDL         = "ddl"         // CREATE, ALTER, DROP, COMMENT, GRANT, REVOKE, ...
	KindTransaction = "transaction" // BEGIN, COMMIT, ROLLBACK, SAVEPOINT, ...
	KindUtility     = "utility"     // everything else: SET, SHOW, VACUUM, LISTEN, ...
	// KindUnknown is a statement the classifier could not see into: nested
	// past its depth limit, past its other limits, or an EXECUTE of a name
	// the connection has not prepared where the proxy could see. It names
	// no table.
	KindUnknown = "unknown"
)

// kindNames are the kinds, in the order of the bits above: the canonical
// order (TestKindBits catches a bit that names the wrong kind).
var kindNames = [kindCount]string{KindSelect, KindInsert, KindUpdate, KindDelete, KindMerge, KindCopy,
	KindTruncate, KindLock, KindCall, KindDo, KindFunction, KindDDL, KindTransaction, KindUtility, KindUnknown}

// Kinds lists the kinds of statement, in their canonical order.
func Kinds() []string { return append([]string(nil), kindNames[:]...) }

// kindLists interns the kind lists, so a Statement holds a shared slice.
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

// Classify classifies the statements in sql as a server with default
// settings lexes it. It never fails: text it cannot make sense of is a
// utility statement, which the server will most likely refuse anyway.
func Classify(sql string) *Class { return ClassifyWith(sql, Settings{}) }

var classifiers = sync.Pool{New: func() any { return new(classifier) }}

// ClassifyWith classifies sql as a server with settings s lexes it.
func ClassifyWith(sql string, s Settings) *Class {
	c := classifiers.Get().(*classifier)
	out := c.run(sql, s)
	c.release()
	classifiers.Put(c)
	return out
}

// run classifies one text: tokens are fed one at a time to the statement
// being read, which is added to the Class at each top-level semicolon.
func (c *classifier) run(sql string, s Settings) *Class {
	c.lx = lexer{src: sql, set: s}
	c.out = &Class{}
	c.out.Statements = c.out.one[:0]
	c.names = 0
	c.resetStatement()
	for {
		t := c.lx.next()
		if t.kind == tokEOF {
			break
		}
		c.token(t)
	}
	c.endStatement()
	return c.out
}

// release drops what the classifier holds of the text, before it goes back
// to the pool.
func (c *classifier) release() {
	c.lx = lexer{}
	c.out = nil
	c.st = stmt{}
}
