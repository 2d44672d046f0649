package sqlclass

// Tables are found by readers: a keyword that introduces table names (FROM,
// JOIN, INTO, UPDATE, USING, TABLE, and COPY, TRUNCATE, LOCK as the first
// word, ON after GRANT or CREATE INDEX and the like) starts one at the
// current parenthesis depth, and it reads the names that follow, token by
// token: [ONLY|LATERAL] name [*] [[AS] alias [(cols)]], .... A "(" in a
// list suspends the reader until its ")" (a subquery, a function's
// arguments, a column list), while the tokens inside are read at their own
// depth; so subqueries at any depth count, at one reader per depth.
type reader struct {
	mode   readerMode
	state  uint8
	resume uint8 // the state to go on in when the suspending ")" comes
	waits  bool  // suspended by a "("

	from     bool // FROM-list rules: aliases, functions, subqueries
	target   bool // names written to, which a CTE of the same name never shadows
	ifExists bool // TABLE [IF [NOT] EXISTS]
	onIntro  bool // GRANT ... ON: words like SCHEMA or FUNCTION name no table
	using    bool // USING: "(" is JOIN ... USING's column list, or a subquery
	op, as   bool // UPDATE: the "*" and the AS seen
	alias    bool // UPDATE: the alias seen

	name nameParts
}

type readerMode uint8

const (
	rOff    readerMode = iota
	rList              // comma-separated table references
	rInto              // [TEMP|TEMPORARY|UNLOGGED|TABLE] name
	rUpdate            // [ONLY] name [*] [[AS] alias] SET
)

// rList states.
const (
	lsPending    uint8 = iota // the first token may say this is no list (COPY (, TRUNCATE TABLE, GRANT ON SCHEMA)
	lsItem                    // [ONLY|LATERAL] then a name or "("
	lsName                    // after a part of a name
	lsNameDot                 // after "name."
	lsAfterItem               // "*", then [AS] alias, ","
	lsAfterOp                 // [AS] alias, ","
	lsAlias                   // after AS
	lsAfterAlias              // "(" cols, or ","
	lsAfterCols               // ","
)

// rInto and rUpdate states.
const (
	nsSkip  uint8 = iota // words before the name
	nsName               // after a part of the name
	nsDot                // after "name."
	nsAfter              // UPDATE: up to SET
)

// nameParts is a qualified name being read, as tokens.
type nameParts struct {
	n     int
	parts [maxNameParts]token
}

func (p *nameParts) start(t token) { p.n, p.parts[0] = 1, t }

func (p *nameParts) add(t token) {
	if p.n < maxNameParts {
		p.parts[p.n] = t
		p.n++
	}
}

// startReader starts the reader a keyword introduces, at the current depth.
func (c *classifier) startReader(t token) {
	if t.kind != tokIdent || t.kw == kwNone {
		return
	}
	st := &c.st
	r := &c.readers[st.depth]
	switch t.kw {
	case kwFrom:
		if (st.first == kwCopy && st.depth == 0) || c.inFunc[st.depth] || st.prev.is(kwDistinct) {
			return // COPY's file, extract(... FROM ...), IS DISTINCT FROM
		}
		*r = reader{mode: rList, from: true, state: lsItem, target: st.prev.is(kwDelete)}
	case kwJoin:
		*r = reader{mode: rList, from: true, state: lsItem}
	case kwInto:
		*r = reader{mode: rInto, state: nsSkip, target: true}
	case kwUpdate:
		*r = reader{mode: rUpdate, state: nsSkip, target: true}
	case kwUsing:
		if !st.ddl && !st.prev.is(kwIndex) {
			*r = reader{mode: rList, from: true, state: lsItem, using: true}
		}
	case kwTable:
		*r = reader{mode: rList, state: lsItem, ifExists: true, target: st.first != kwSelect && st.first != kwWith && st.first != kwTable}
	case kwCopy, kwTruncate, kwLock:
		if st.ntok == 0 {
			*r = reader{mode: rList, state: lsPending, target: true}
		}
	case kwOn:
		if st.onIntro && st.depth == 0 {
			*r = reader{mode: rList, state: lsPending, target: true, onIntro: true}
		}
	}
}

// readToken feeds a token other than a parenthesis to the reader at the
// current depth.
func (c *classifier) readToken(t token) {
	r := &c.readers[c.st.depth]
	for r.mode != rOff && !r.waits && !c.readStep(r, t) {
	}
}

// readStep feeds t to r; false means r moved to a state that must see t too.
func (c *classifier) readStep(r *reader, t token) bool {
	switch r.mode {
	case rList:
		return c.listStep(r, t)
	case rInto, rUpdate:
		return c.targetStep(r, t)
	}
	return true
}

// targetStep feeds t to an INTO or UPDATE reader: the words it skips, then
// one qualified name, which INTO records where it ends and UPDATE once
// its SET comes (updateStep).
func (c *classifier) targetStep(r *reader, t token) bool {
	into := r.mode == rInto
	switch r.state {
	case nsSkip:
		switch {
		case into && (t.is(kwTemporary) || t.is(kwTemp) || t.is(kwUnlogged) || t.is(kwTable)):
		case !into && t.is(kwOnly):
		case t.isName():
			r.name.start(t)
			r.state = nsName
		default:
			r.mode = rOff
		}
	case nsName:
		if t.kind == tokDot {
			r.state = nsDot
			return true
		}
		if !into {
			r.state = nsAfter
			return false
		}
		c.addName(r)
		r.mode = rOff
	case nsDot:
		if t.isIdent() {
			r.name.add(t)
			r.state = nsName
			return true
		}
		if into {
			c.addName(r)
		}
		r.mode = rOff
	case nsAfter:
		c.updateStep(r, t)
	}
	return true
}

// updateStep reads UPDATE [ONLY] name [*] [[AS] alias] SET from after the
// name; not FOR UPDATE, ON UPDATE, DO UPDATE SET, THEN UPDATE SET.
func (c *classifier) updateStep(r *reader, t token) {
	switch {
	case t.is(kwSet):
		c.addName(r)
		r.mode = rOff
	case t.kind == tokOp && !r.op && !r.as && !r.alias:
		r.op = true
	case t.is(kwAs) && !r.as && !r.alias:
		r.as = true
	case !r.alias:
		r.alias = true
	default:
		r.mode = rOff
	}
}

func (c *classifier) listStep(r *reader, t token) bool {
	switch r.state {
	case lsPending:
		if t.is(kwTable) || (r.onIntro && t.kind == tokIdent && t.kw.object()) {
			r.mode = rOff
			return true
		}
		r.state = lsItem
		return false
	case lsItem:
		switch {
		case t.is(kwOnly) || t.is(kwLateral):
		case r.ifExists && (t.is(kwIf) || t.is(kwNot) || t.is(kwExists)):
		case t.isName():
			r.name.start(t)
			r.state = lsName
		default:
			r.mode = rOff
		}
		r.ifExists = r.ifExists && r.state == lsItem
	case lsName:
		if t.kind == tokDot {
			r.state = lsNameDot
			return true
		}
		c.addName(r)
		r.state = lsAfterItem
		return false
	case lsNameDot:
		if t.isIdent() {
			r.name.add(t)
			r.state = lsName
			return true
		}
		c.addName(r)
		r.mode = rOff
	case lsAfterItem, lsAfterOp:
		switch {
		case t.kind == tokOp && r.state == lsAfterItem: // ONLY name *
			r.state = lsAfterOp
		case t.kind == tokComma:
			r.state = lsItem
		case !r.from:
			r.mode = rOff
		case t.is(kwAs):
			r.state = lsAlias
		case t.isName():
			r.state = lsAfterAlias
		default:
			r.mode = rOff
		}
	case lsAlias:
		if t.isIdent() {
			r.state = lsAfterAlias
		} else {
			r.mode = rOff
		}
	case lsAfterAlias, lsAfterCols:
		if t.kind == tokComma {
			r.state = lsItem
		} else {
			r.mode = rOff
		}
	}
	return true
}

// readerParen feeds a "(" to the reader at its depth. It reports whether
// the parenthesis is a column list rather than a call, and whether a list
// of tables may follow inside it (FROM (a JOIN b)).
func (c *classifier) readerParen(r *reader) (notCall, nested bool) {
	if r.mode == rOff || r.waits {
		return false, false
	}
	suspend := func(resume uint8) { r.waits, r.resume = true, resume }
	switch r.mode {
	case rList:
		switch r.state {
		case lsItem:
			if r.from {
				suspend(lsAfterItem) // a subquery, or tables joined in parentheses
				return false, !r.using
			}
		case lsName:
			if r.from {
				suspend(lsAfterItem) // a function in FROM: a call, not a table
				return false, false
			}
			c.addName(r)
			suspend(lsAfterItem) // COPY t (cols), TABLE t (...)
			return true, false
		case lsNameDot:
			c.addName(r)
		case lsAfterAlias:
			suspend(lsAfterCols) // AS x (cols)
			return true, false
		}
	case rInto:
		if r.state == nsName || r.state == nsDot {
			c.addName(r) // INSERT INTO t (cols)
			r.mode = rOff
			return true, false
		}
	}
	r.mode = rOff
	return false, false
}

// flushReader records the name a reader was in the middle of when the
// statement ended.
func (c *classifier) flushReader(r *reader) {
	if r.mode == rOff || r.waits {
		return
	}
	switch {
	case r.mode == rList && (r.state == lsName || r.state == lsNameDot),
		r.mode == rInto && (r.state == nsName || r.state == nsDot):
		c.addName(r)
	}
	r.mode = rOff
}

// resumeReader wakes the reader at the depth a ")" returned to.
func (c *classifier) resumeReader(r *reader) {
	if r.waits {
		r.waits, r.state = false, r.resume
	}
}

// addName records the name r has read as a table.
func (c *classifier) addName(r *reader) {
	if r.name.n == 0 {
		return
	}
	b := c.nameBytes(&r.name)
	r.name.n = 0
	if len(b) == 0 || b[len(b)-1] == '.' || b[0] == '.' {
		return // "": the server refuses a zero-length name
	}
	st := &c.st
	if !r.target && !containsByte(b, '.') && st.ctes.has(b) {
		return // a CTE, not a table
	}
	set := &st.tables
	if st.inPrep {
		set = &st.prepTables
	}
	if set.has(b) {
		return
	}
	if c.names >= MaxNames {
		c.giveUp()
		return
	}
	c.names++
	set.add(string(b))
}

func (c *classifier) addCTE(t token) {
	var p nameParts
	p.start(t)
	b := c.nameBytes(&p)
	if c.st.ctes.has(b) {
		return
	}
	if c.names >= MaxNames {
		c.giveUp()
		return
	}
	c.names++
	c.st.ctes.add(string(b))
}

func containsByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}

// nameSet is a small set of names in the order they came.
type nameSet struct {
	list []string
	m    map[string]struct{}
}

func (s *nameSet) has(b []byte) bool {
	if s.m != nil {
		_, ok := s.m[string(b)]
		return ok
	}
	for _, x := range s.list {
		if x == string(b) {
			return true
		}
	}
	return false
}

func (s *nameSet) add(name string) {
	s.list = append(s.list, name)
	if s.m == nil && len(s.list) > 8 {
		s.m = make(map[string]struct{}, 16)
		for _, x := range s.list {
			s.m[x] = struct{}{}
		}
	} else if s.m != nil {
		s.m[name] = struct{}{}
	}
}

// take returns the names and empties the set; the slice is the caller's.
func (s *nameSet) take() []string {
	l := s.list
	s.list, s.m = nil, nil
	return l
}

// reset empties the set, keeping nothing the last text owns.
func (s nameSet) reset() nameSet { return nameSet{} }
