package sqlclass

// A frame is one statement nested in the statement being read, from its
// leading keyword on: the statement itself (the root), EXPLAIN's statement,
// a WITH's main statement, DECLARE ... FOR's query, PREPARE ... AS's
// statement, COPY (...)'s query. Each kind of frame reads its own prefix
// with a few states, and gathers, while it is the innermost, the features
// its kinds depend on (FOR UPDATE, data-modifying CTEs, ON CONFLICT DO
// UPDATE, SELECT INTO, function calls). A frame's kinds are settled when it
// closes and handed to its parent: frames nest without recursion.
type frame struct {
	kind    frameKind
	state   uint8
	lead    keyword
	base    int     // paren depth of its leading keyword
	close   int     // inside COPY's parentheses: the depth at which ")" ends it; -1 otherwise
	kinds   kindSet // fFixed: its kinds; others: their child's, once it closed
	mod     kindSet // data-modifying statements opened by "(" (a WITH's CTEs), at any depth
	execute string  // the prepared statement it runs

	child, lock, into, conflict, doUpdate, analyze, analyzeNext, calls bool
}

type frameKind uint8

const (
	fLead    frameKind = iota // before its leading keyword (leading "(" included)
	fSelect                   // SELECT, VALUES, TABLE
	fWith                     // WITH's list; its main statement is its child
	fInsert                   // INSERT
	fUpdate                   // UPDATE
	fDelete                   // DELETE
	fMerge                    // MERGE
	fCopy                     // COPY; COPY (query)'s query is its child
	fExplain                  // EXPLAIN [options]; the statement is its child
	fDeclare                  // DECLARE ... FOR; the query is its child
	fPrepare                  // PREPARE name [(types)] AS; the statement is its child
	fExecute                  // EXECUTE name [(args)]
	fDDL                      // CREATE, ALTER, DROP, ...
	fFixed                    // a statement whose first word says all (its kinds)
)

// States of each kind of frame.
const (
	wStart     uint8 = iota // WITH: RECURSIVE or the first name
	wName                   // a CTE's name
	wAfterName              // its column list, or AS
	wCols                   // inside its column list
	wAs                     // after AS: [NOT] MATERIALIZED, then its body
	wBody                   // inside its body
	wAfterBody              // SEARCH/CYCLE, then "," or the main statement
)

const (
	cAfter uint8 = iota // COPY: "(" opens a query, anything else names a table
	cQuery              // inside the query's parentheses
	cBody               // the rest
)

const (
	eOpts  uint8 = iota // EXPLAIN: ANALYZE, VERBOSE or "(" options, then the statement
	eParen              // inside "(" options ")"
	eChild              // the statement
)

const (
	pName      uint8 = iota // PREPARE: TRANSACTION, or the name
	pAfterName              // "(" types, or AS
	pTypes                  // inside the types
	pBody                   // the statement
)

const (
	xName uint8 = iota // EXECUTE: the name
	xArgs              // its arguments
)

const (
	ddlBody     uint8 = iota
	ddlAs             // after AS: EXECUTE?
	ddlExecName       // after AS EXECUTE: the name
)

const (
	fxDone     uint8 = iota
	fxSet1           // SET: TRANSACTION or SESSION?
	fxSet2           // SET SESSION: CHARACTERISTICS?
	fxDealloc        // DEALLOCATE: [PREPARE] name or ALL
	fxDiscard        // DISCARD: ALL?
	fxCallName       // CALL name: its "(" is the procedure's, not a call to find
)

// result is the frame's kinds, once it is complete.
func (f *frame) result() kindSet {
	var k kindSet
	switch f.kind {
	case fLead:
		k = kUtility
	case fSelect:
		k = kSelect | f.mod
		if f.lock {
			k |= kLock
		}
		if f.into {
			k |= kDDL
		}
	case fWith:
		k = f.mod
		mk := f.kinds
		if k != 0 {
			mk &^= kSelect // a WITH that writes is not a read
		}
		k |= mk
		if f.lock {
			k |= kLock
		}
		if k == 0 {
			k = kSelect
		}
	case fInsert:
		k = kInsert | f.mod
		if f.conflict && f.doUpdate {
			k |= kUpdate
		}
	case fUpdate:
		k = kUpdate | f.mod
	case fDelete:
		k = kDelete | f.mod
	case fMerge:
		k = kMerge | f.mod
	case fCopy:
		k = kCopy | f.kinds&(dmlKinds|kLock|kFunction)
	case fExplain:
		// EXPLAIN runs its statement only with ANALYZE.
		k = kUtility
		if f.analyze && f.child {
			k = f.kinds
		}
	case fDeclare:
		k = f.kinds
		if !f.child {
			k = kUtility
		}
	case fPrepare:
		k = kUtility
	case fExecute:
		k = 0 // what it runs, once resolved
	case fDDL:
		k = kDDL
	case fFixed:
		k = f.kinds
	}
	if f.calls {
		k |= kFunction
	}
	return k
}

func (c *classifier) top() *frame { return &c.frames[len(c.frames)-1] }

func (c *classifier) isRoot(f *frame) bool { return f == &c.frames[0] }

// pushChild opens a frame above the innermost one; close is the depth at
// which ")" ends it, or -1. Past MaxDepth the statement is given up.
func (c *classifier) pushChild(close int) bool {
	if c.nesting()+1 > MaxDepth {
		c.giveUp()
		return false
	}
	c.top().child = true
	c.frames = append(c.frames, frame{kind: fLead, close: close})
	return true
}

// closeFrame settles the innermost frame and hands its kinds to its parent.
func (c *classifier) closeFrame() {
	st := &c.st
	f := c.frames[len(c.frames)-1]
	c.frames = c.frames[:len(c.frames)-1]
	k := f.result()
	if len(c.frames) == 0 {
		st.kinds, st.execute = k, f.execute
		return
	}
	p := c.top()
	p.mod |= f.mod
	switch p.kind {
	case fWith, fDeclare:
		p.kinds = k
	case fCopy:
		p.kinds, p.state = k, cBody
	case fExplain:
		p.kinds = k
		if p.analyze {
			p.execute = f.execute
		}
	case fPrepare:
		st.prepared = &Statement{Kinds: kindLists[k], Tables: st.prepTables.take(), Count: 1, Execute: f.execute, set: k}
		st.inPrep = false
	}
}

// frameToken feeds a token other than a parenthesis to the innermost frame;
// a frame that opens a child for it hands it on.
func (c *classifier) frameToken(t token) {
	for !c.st.unknown && !c.step(c.top(), t) {
	}
}

// step feeds t to f and reports whether f took it; false means f opened a
// child that takes it (the child's leading keyword).
func (c *classifier) step(f *frame, t token) bool {
	switch f.kind {
	case fLead:
		c.lead(f, t)
	case fSelect, fInsert, fUpdate, fDelete, fMerge:
		c.body(f, t)
	case fWith:
		return c.withStep(f, t)
	case fCopy:
		if f.state == cAfter {
			f.state = cBody // COPY table
		}
	case fExplain:
		return c.explainStep(f, t)
	case fDeclare:
		if !f.child && t.is(kwFor) {
			c.pushChild(-1)
		}
	case fPrepare:
		c.prepareStep(f, t)
	case fExecute:
		if f.state == xName {
			if t.isIdent() {
				f.execute, f.state = c.identText(t), xArgs
			} else {
				f.kind, f.kinds = fFixed, kUtility
			}
		}
	case fDDL:
		c.ddlStep(f, t)
	case fFixed:
		c.fixedStep(f, t)
	}
	return true
}

// lead reads a frame's leading keyword.
func (c *classifier) lead(f *frame, t token) {
	f.lead, f.base = t.kw, c.st.depth
	fixed := func(k kindSet, state uint8) { f.kind, f.kinds, f.state = fFixed, k, state }
	if t.kind != tokIdent {
		fixed(kUtility, fxDone)
		return
	}
	switch t.kw {
	case kwSelect, kwValues, kwTable:
		f.kind = fSelect
	case kwWith:
		f.kind, f.state = fWith, wStart
	case kwInsert:
		f.kind = fInsert
	case kwUpdate:
		f.kind = fUpdate
	case kwDelete:
		f.kind = fDelete
	case kwMerge:
		f.kind = fMerge
	case kwCopy:
		f.kind, f.state = fCopy, cAfter
	case kwExplain:
		f.kind, f.state = fExplain, eOpts
	case kwDeclare:
		f.kind = fDeclare
	case kwPrepare:
		f.kind, f.state = fPrepare, pName
		if !c.isRoot(f) {
			fixed(kUtility, fxDone) // not valid SQL there
		}
	case kwExecute:
		f.kind, f.state = fExecute, xName
	case kwCreate, kwAlter, kwDrop, kwComment, kwGrant, kwRevoke, kwSecurity, kwRefresh, kwImport, kwReassign:
		f.kind, f.state = fDDL, ddlBody
	case kwTruncate:
		fixed(kTruncate, fxDone)
	case kwLock:
		fixed(kLock, fxDone)
	case kwCall:
		fixed(kCall, fxCallName)
	case kwDo:
		fixed(kDo, fxDone)
	case kwBegin, kwStart, kwCommit, kwEnd, kwRollback, kwAbort, kwSavepoint, kwRelease:
		fixed(kTransaction, fxDone)
	case kwSet:
		fixed(kUtility, fxSet1)
	case kwDeallocate:
		fixed(kUtility, fxDealloc)
	case kwDiscard:
		fixed(kUtility, fxDiscard)
	default:
		fixed(kUtility, fxDone)
	}
}

// body gathers what a statement's kinds depend on: FOR UPDATE/SHARE, a
// data-modifying statement in parentheses (a WITH's CTE), ON CONFLICT DO
// UPDATE, a top-level SELECT INTO.
func (c *classifier) body(f *frame, t token) {
	if t.kind != tokIdent {
		return
	}
	st := &c.st
	switch t.kw {
	case kwInsert, kwUpdate, kwDelete, kwMerge:
		if st.prev.kind == tokLParen {
			f.mod |= dmlKind(t.kw)
		}
	}
	switch t.kw {
	case kwUpdate:
		if st.prev.is(kwFor) {
			f.lock = true
		}
		if st.prev.is(kwDo) && f.conflict {
			f.doUpdate = true
		}
	case kwShare:
		if st.prev.is(kwFor) || (st.prev.is(kwKey) && st.prev2.is(kwFor)) {
			f.lock = true
		}
	case kwKey:
		if st.prev.is(kwNo) && st.prev2.is(kwFor) {
			f.lock = true
		}
	case kwConflict:
		if st.prev.is(kwOn) {
			f.conflict = true
		}
	case kwInto:
		if f.lead == kwSelect && st.depth == f.base {
			f.into = true
		}
	}
}

func dmlKind(k keyword) kindSet {
	switch k {
	case kwInsert:
		return kInsert
	case kwUpdate:
		return kUpdate
	case kwDelete:
		return kDelete
	}
	return kMerge
}

// withStep reads WITH [RECURSIVE] name [(cols)] AS [NOT] [MATERIALIZED]
// (body) [SEARCH ...] [CYCLE ...], ... and opens the main statement.
func (c *classifier) withStep(f *frame, t token) bool {
	st := &c.st
	switch f.state {
	case wStart:
		f.state = wName
		if t.is(kwRecursive) {
			return true
		}
		return c.withStep(f, t)
	case wName:
		if t.isIdent() {
			c.addCTE(t)
			f.state = wAfterName
			return true
		}
	case wAfterName:
		if t.is(kwAs) {
			f.state = wAs
			return true
		}
	case wAs:
		if t.is(kwNot) || t.is(kwMaterialized) {
			return true
		}
	case wCols:
		return true
	case wBody:
		c.body(f, t)
		return true
	case wAfterBody:
		if st.depth == f.base {
			if t.kind == tokComma {
				f.state = wName
				return true
			}
			if t.kind == tokIdent {
				switch t.kw {
				case kwSelect, kwInsert, kwUpdate, kwDelete, kwMerge, kwValues, kwTable:
					return !c.pushChild(-1)
				}
			}
		}
		return true
	}
	f.state = wAfterBody // not a WITH list as this package knows it
	return c.withStep(f, t)
}

func (c *classifier) explainStep(f *frame, t token) bool {
	switch f.state {
	case eOpts:
		switch {
		case t.is(kwAnalyze) || t.is(kwAnalyse):
			f.analyze = true
		case t.is(kwVerbose):
		default:
			f.state = eChild
			return !c.pushChild(-1)
		}
	case eParen:
		switch {
		case t.is(kwAnalyze) || t.is(kwAnalyse):
			f.analyze, f.analyzeNext = true, true
		case f.analyzeNext:
			f.analyzeNext = false
			if t.is(kwFalse) || t.is(kwOff) || (t.kind == tokNumber && c.lx.src[t.start:t.end] == "0") {
				f.analyze = false
			}
		}
	}
	return true
}

func (c *classifier) prepareStep(f *frame, t token) {
	st := &c.st
	switch f.state {
	case pName:
		switch {
		case t.is(kwTransaction):
			f.kind, f.kinds = fFixed, kTransaction
		case t.isIdent():
			st.op, st.name, f.state = OpPrepare, c.identText(t), pAfterName
		default:
			f.kind, f.kinds = fFixed, kUtility
		}
	case pAfterName:
		if t.is(kwAs) && c.pushChild(-1) {
			f.state, st.inPrep = pBody, true
		}
	}
}

func (c *classifier) ddlStep(f *frame, t token) {
	switch f.state {
	case ddlBody:
		if t.is(kwAs) && c.st.depth == f.base {
			f.state = ddlAs
		}
	case ddlAs:
		f.state = ddlBody
		if t.is(kwExecute) {
			f.state = ddlExecName
		}
	case ddlExecName:
		f.state = ddlBody
		if t.isIdent() {
			f.execute = c.identText(t)
		}
	}
}

func (c *classifier) fixedStep(f *frame, t token) {
	st := &c.st
	switch f.state {
	case fxSet1:
		f.state = fxDone
		switch {
		case t.is(kwTransaction):
			f.kinds = kTransaction
		case t.is(kwSession):
			f.state = fxSet2
		}
	case fxSet2:
		f.state = fxDone
		if t.is(kwCharacteristics) {
			f.kinds = kTransaction
		}
	case fxDealloc:
		if t.is(kwPrepare) {
			return
		}
		f.state = fxDone
		switch {
		case !c.isRoot(f):
		case t.is(kwAll):
			st.op = OpDeallocateAll
		case t.isIdent():
			st.op, st.name = OpDeallocate, c.identText(t)
		}
	case fxDiscard:
		f.state = fxDone
		if c.isRoot(f) && t.is(kwAll) {
			st.op = OpDiscardAll
		}
	}
}

// frameParen feeds a "(" to the innermost frame. It reports whether the
// parenthesis belongs to the frame's own syntax (a column list, options,
// types, arguments), so that it is not taken for a function call.
func (c *classifier) frameParen() (notCall bool) {
	f := c.top()
	d := c.st.depth
	switch f.kind {
	case fWith:
		switch f.state {
		case wStart, wName:
			f.state = wAfterBody
		case wAfterName:
			f.state = wCols
			return true
		case wAs:
			f.state = wBody
			return true
		case wAfterBody:
			if d == f.base {
				c.pushChild(-1) // the main statement, in parentheses
			}
		}
	case fCopy:
		if f.state == cAfter {
			f.state = cQuery
			c.st.copyQuery = true
			return true
		}
	case fExplain:
		if f.state == eOpts {
			f.state = eParen
			return true
		}
	case fPrepare:
		if f.state == pAfterName {
			f.state = pTypes
			return true
		}
		return f.state != pBody
	case fExecute:
		return f.state == xArgs && d == f.base
	case fFixed:
		if f.state == fxCallName {
			f.state = fxDone
			return true
		}
	}
	return false
}

// openCopyQuery opens COPY (query)'s frame, once its "(" is counted.
func (c *classifier) openCopyQuery() {
	if c.st.copyQuery {
		c.st.copyQuery = false
		c.pushChild(c.st.depth - 1)
	}
}

// frameParenClosed follows a ")" in the frames: COPY's query ends, and
// states that wait for a parenthesis to close move on.
func (c *classifier) frameParenClosed() {
	d := c.st.depth
	for i := len(c.frames) - 1; i > 0; i-- {
		if cl := c.frames[i].close; cl >= 0 {
			if cl == d {
				for len(c.frames) > i {
					c.closeFrame()
				}
			}
			break
		}
	}
	f := c.top()
	if d != f.base {
		return
	}
	switch {
	case f.kind == fWith && f.state == wCols:
		f.state = wAfterName
	case f.kind == fWith && f.state == wBody:
		f.state = wAfterBody
	case f.kind == fExplain && f.state == eParen:
		f.state = eOpts
	case f.kind == fPrepare && f.state == pTypes:
		f.state = pAfterName
	}
}

// detectsCalls reports whether a function call in the innermost frame counts:
// not in DDL (column definitions, function signatures), options or prefixes.
func (f *frame) detectsCalls() bool {
	switch f.kind {
	case fSelect, fInsert, fUpdate, fDelete, fMerge, fExecute:
		return true
	case fWith:
		return f.state == wBody || f.state == wAfterBody
	case fCopy:
		return f.state == cBody
	case fFixed:
		return f.lead == kwCall
	}
	return false
}
