package sqlclass

import "slices"

// classifier reads a text's tokens one at a time, in one pass, keeping only
// bounded state: the statement being read, its open frames (the statements
// nested in it: EXPLAIN's, a WITH's main statement, ...), one table reader
// per open parenthesis and the last two tokens. Nothing recurses.
type classifier struct {
	lx    lexer
	out   *Class
	names int // table and CTE names kept for the text, up to MaxNames
	st    stmt

	// Reused across texts (the classifier is pooled); their lengths never
	// pass MaxDepth.
	frames  []frame
	readers []reader // by paren depth
	inFunc  []bool   // by paren depth: opened by extract(, substring(, ...

	// A name being read (a U& name's last character may pass nameLen
	// before it is cut), and a U& identifier's body being decoded.
	buf  [maxNameParts*(nameLen+1) + 16]byte
	ubuf [maxEscapedName]byte
}

// stmt is the statement being read.
type stmt struct {
	ntok      int
	first     keyword // its first token, when a keyword
	depth     int     // open parentheses
	atomic    bool    // inside CREATE FUNCTION's BEGIN ATOMIC ... END,
	cases     int     // in which CASE ... END nest
	unknown   bool    // past a limit: only its end is looked for now
	ddl       bool    // its first word is a DDL command
	onIntro   bool    // GRANT/REVOKE, CREATE INDEX/TRIGGER/POLICY/RULE/STATISTICS: ON names a table
	inPrep    bool    // inside PREPARE ... AS: tables go to the prepared statement
	copyQuery bool    // COPY's "(" opens its query's frame once counted

	prev, prev2 token
	fn          funcName

	tables, prepTables, ctes nameSet

	// What the root frame leaves.
	kinds    kindSet
	execute  string
	op       Op
	name     string
	prepared *Statement
}

// funcName follows a possibly qualified name, for the "(" that may follow.
type funcName struct {
	parts      int
	last, qual token
}

func (c *classifier) resetStatement() {
	st := &c.st
	tables, prep, ctes := st.tables, st.prepTables, st.ctes
	*st = stmt{}
	st.tables, st.prepTables, st.ctes = tables.reset(), prep.reset(), ctes.reset()
	c.frames = c.frames[:0]
	c.growDepth(0)
	c.readers[0] = reader{}
	c.inFunc[0] = false
}

// growDepth makes the per-depth slices hold depth d.
func (c *classifier) growDepth(d int) {
	for len(c.readers) <= d {
		c.readers = append(c.readers, reader{})
		c.inFunc = append(c.inFunc, false)
	}
}

// nesting is how deep the statement nests: parentheses plus frames inside
// the root.
func (c *classifier) nesting() int { return c.st.depth + max(len(c.frames)-1, 0) }

// token feeds one token to the statement being read.
func (c *classifier) token(t token) {
	st := &c.st
	if t.kind == tokSemi && st.depth == 0 && !st.atomic {
		c.endStatement()
		return
	}
	if st.ntok == 0 {
		c.startStatement(t)
	}
	if t.kind == tokIdent {
		c.atomicBody(t)
	}
	switch {
	case st.unknown:
		switch t.kind {
		case tokLParen:
			st.depth++
		case tokRParen:
			st.depth = max(st.depth-1, 0)
		}
	case t.kind == tokLParen:
		c.openParen(t)
	case t.kind == tokRParen:
		c.closeParen()
	default:
		c.readToken(t)
		c.frameToken(t)
		c.startReader(t)
	}
	c.followName(t)
	st.prev2, st.prev = st.prev, t
	st.ntok++
}

func (c *classifier) startStatement(t token) {
	st := &c.st
	if t.kind == tokIdent {
		st.first = t.kw
		switch t.kw {
		case kwCreate, kwAlter, kwDrop, kwComment, kwGrant, kwRevoke, kwSecurity, kwRefresh, kwImport, kwReassign:
			st.ddl = true
		}
		st.onIntro = t.kw == kwGrant || t.kw == kwRevoke
	}
	c.frames = append(c.frames, frame{kind: fLead, close: -1})
}

// atomicBody follows CREATE FUNCTION ... BEGIN ATOMIC ... END, whose
// semicolons do not end the statement.
func (c *classifier) atomicBody(t token) {
	st := &c.st
	switch {
	case t.kw == kwAtomic && st.prev.is(kwBegin) && st.first == kwCreate:
		st.atomic = true
	case st.atomic && t.kw == kwCase:
		st.cases++
	case st.atomic && t.kw == kwEnd:
		if st.cases > 0 {
			st.cases--
		} else {
			st.atomic = false
		}
	case st.first == kwCreate && st.ntok >= 1 && st.ntok <= 5:
		switch t.kw {
		case kwIndex, kwTrigger, kwPolicy, kwRule, kwStatistics:
			st.onIntro = true
		}
	}
}

// giveUp marks the statement unknown: a limit was passed. Only its end is
// looked for from now on.
func (c *classifier) giveUp() {
	c.st.unknown = true
}

func (c *classifier) openParen(t token) {
	st := &c.st
	d := st.depth
	notCall, nested := c.readerParen(&c.readers[d])
	if c.frameParen() {
		notCall = true
	}
	if !notCall {
		c.maybeCall()
	}
	st.depth++
	if c.nesting() > MaxDepth {
		c.giveUp()
		return
	}
	c.growDepth(st.depth)
	c.readers[st.depth] = reader{}
	if nested {
		c.readers[st.depth] = reader{mode: rList, from: true, state: lsItem}
	}
	c.inFunc[st.depth] = st.prev.kind == tokIdent && isFromFunction(c.lx.src[st.prev.start:st.prev.end])
	c.openCopyQuery()
}

func (c *classifier) closeParen() {
	st := &c.st
	if st.depth == 0 {
		return // an unmatched ")": the server will refuse the text
	}
	c.flushReader(&c.readers[st.depth])
	st.depth--
	c.frameParenClosed()
	c.resumeReader(&c.readers[st.depth])
}

// followName follows a qualified name a.b.c as it is read.
func (c *classifier) followName(t token) {
	fn := &c.st.fn
	switch t.kind {
	case tokIdent, tokQIdent, tokUIdent:
		if c.st.prev.kind == tokDot && fn.parts > 0 {
			fn.parts++
			fn.qual, fn.last = fn.last, t
		} else {
			*fn = funcName{parts: 1, last: t}
		}
	case tokDot:
	default:
		fn.parts = 0
	}
}

// endStatement closes the statement being read and adds it to the Class.
func (c *classifier) endStatement() {
	st := &c.st
	if st.ntok == 0 {
		return
	}
	if !st.unknown {
		for d := 0; d <= st.depth; d++ {
			c.flushReader(&c.readers[d])
		}
	}
	for len(c.frames) > 0 {
		c.closeFrame()
	}
	s := Statement{Count: 1, set: st.kinds}
	if st.unknown || st.kinds&kUnknown != 0 {
		s.set = kUnknown
	} else {
		if s.set == 0 && st.execute == "" {
			s.set = kUtility
		}
		s.Tables = st.tables.take()
		s.Execute = st.execute
	}
	s.Kinds = kindLists[s.set]
	s.Op, s.Name, s.Prepared = st.op, st.name, st.prepared
	switch {
	case s.Op == OpPrepare && st.unknown:
		u := Unknown
		s.Prepared = &u
	case s.Op == OpPrepare && s.Prepared == nil:
		s.Op, s.Name = OpNone, "" // PREPARE name without AS: the server refuses it
	}
	// The CTE names go with the statement; so do its tables when it is
	// counted into the entry before it.
	c.names -= len(st.ctes.list)
	if !c.add(s) {
		c.names -= len(s.Tables)
	}
	c.resetStatement()
}

// add appends s to the Class, or counts it into the last entry when it is
// the same statement again; it reports whether s was kept as an entry.
func (c *classifier) add(s Statement) bool {
	out := c.out
	if n := len(out.Statements); n > 0 {
		last := &out.Statements[n-1]
		if n == MaxStatements || (last.set == s.set && last.Op == OpNone && s.Op == OpNone &&
			last.Execute == "" && s.Execute == "" && slices.Equal(last.Tables, s.Tables)) {
			last.Count++
			return false
		}
		if n == MaxStatements-1 {
			out.Statements = append(out.Statements, Unknown) // past the limit: one entry counts the rest
			return false
		}
	}
	out.Statements = append(out.Statements, s)
	return true
}
