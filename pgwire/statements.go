package pgwire

import (
	"bytes"
	"slices"

	"github.com/governor-project/governor/classify/sqlclass"
)

// What a connection's messages run, as the server will run them.
//
// The server keeps one namespace of prepared statements per connection,
// shared by SQL's PREPARE, EXECUTE and DEALLOCATE (and DISCARD ALL) and the
// protocol's Parse, Bind and Close: a statement PREPAREd in SQL may be run
// with Bind and Execute, one Parsed with EXECUTE. The proxy follows that
// namespace (names) so that whatever runs a prepared statement is governed
// as the statement it runs, each time it runs.
//
// A change is applied when the message that makes it is sent, so that the
// messages pipelined behind it see it, and undone when the server refuses
// that message (a name already in use, a syntax error) or skips it (after
// an earlier error, until Sync). The server confirms each in order:
// ParseComplete, CloseComplete, or a CommandComplete tag (PREPARE,
// DEALLOCATE, DEALLOCATE ALL, DISCARD ALL). A message that touches a
// prepared statement while a change sent in an earlier batch is not yet
// confirmed waits for the server to answer that batch: otherwise a Parse
// that will fail could hide the statement the server really has.
//
// How text lexes depends on standard_conforming_strings and
// client_encoding, which the server reports in ParameterStatus, at login and
// after a change. A text whose lexing may depend on them (it holds a
// backslash or a non-ASCII byte) is classified only when the server has
// answered every earlier Query and Sync, so that no change is still on its
// way; within one batch, after an Execute whose ParameterStatus comes only
// at the batch's end, a text that lexes differently under any setting is
// unknown.
//
// A message that waits is held by the machine (actAwait) until the
// server's answer that leaves nothing owed (actWake). The shell bounds the
// wait by the wait timeout, once per message; once it gives up, what the
// server has still not answered is unknown: the message's text, or the
// prepared statement it names.

// names is the connection's view of the server's prepared statements and
// portals, the machine's.
type names struct {
	stmts   map[string]*sqlclass.Class
	portals map[string]*sqlclass.Class
	undo    []change // applied, not yet confirmed, in the order sent
	// Parse and Close messages sent, and ParseComplete and CloseComplete
	// received: the n-th Parse is confirmed by the n-th ParseComplete.
	parses, parsed uint64
	closes, closed uint64
}

// maxPortals bounds the named portals followed; past it they are
// forgotten, and executing one is governed as unknown. Portals end with
// their transaction, and the names are forgotten then too.
const maxPortals = 1024

// change is an applied change to the prepared statements, with what undoes
// it and what confirms it.
type change struct {
	batch uint64 // the Query, or the extended-protocol batch to its Sync, that made it
	ack   ackKind
	seq   uint64 // ackParse, ackClose: the message's number
	tag   string // ackTag: the CommandComplete tag that confirms it
	name  string
	prev  *sqlclass.Class            // what name held before; nil for nothing
	all   map[string]*sqlclass.Class // DEALLOCATE ALL, DISCARD ALL: all there was
}

type ackKind uint8

const (
	ackParse ackKind = iota
	ackClose
	ackTag
)

// nameChange is a change a Query's or Execute's statements make, before it
// is applied.
type nameChange struct {
	name  string
	value *sqlclass.Class // nil deallocates
	all   bool
	tag   string
}

// unknownClass is a text the proxy cannot see into.
var unknownClass = &sqlclass.Class{Statements: []sqlclass.Statement{sqlclass.Unknown}}

// noteParameter follows a ParameterStatus from the server.
func (m *machine) noteParameter(body []byte) {
	name, rest, ok := cstring(body)
	value, _, ok2 := cstring(rest)
	if !ok || !ok2 {
		return
	}
	switch name {
	case "standard_conforming_strings":
		m.lex.BackslashEscapes = value != "on"
	case "client_encoding":
		m.lex.Encoding = sqlclass.EncodingOf(value)
	}
}

// resolve works out what msg runs, as the server will run it: its cl, run
// and changes, and settled for a message that names a prepared statement.
// It reports false when that depends on answers the server still owes;
// once the wait for them was given up (msg.gaveUp), what it would wait for
// is unknown.
func (m *machine) resolve(msg *clientMsg) bool {
	if !m.governs {
		return true
	}
	msg.settled = true
	switch msg.t {
	case MsgQuery:
		if msg.byConn && !msg.lexed {
			msg.cl = byConnection
			return true
		}
		if !m.resolveText(msg) || !m.resolveRun(msg) {
			return false
		}
		if msg.byConn {
			// Classified only to tell whether it writes; its lease and
			// charges stay the connection's, and its changes to prepared
			// statements are not followed.
			msg.cl, msg.changes = byConnection, nil
		}
	case MsgFunctionCall:
		msg.cl, msg.run = functionCallClass, functionCallClass.Statements
	case MsgParse:
		return m.resolveText(msg) && m.resolveName(msg, msg.name)
	case MsgBind:
		return m.resolveName(msg, msg.stmt)
	case MsgExecute:
		msg.cl = m.portal(msg.name)
		return m.resolveRun(msg)
	case MsgClose:
		if msg.kind == 'S' {
			return m.resolveName(msg, msg.name)
		}
	}
	return true
}

// resolveText classifies a Query's or Parse's text as the server will lex
// it: when its lexing may depend on the settings (it holds a backslash or
// a non-ASCII byte), only once the server has answered every earlier Query
// and Sync, so that no change of them is still on its way.
func (m *machine) resolveText(msg *clientMsg) bool {
	sql := msg.text
	switch {
	case !sqlclass.DependsOnSettings(sql):
		msg.cl = m.classifier.ClassifyBytes(sql, m.lex)
	case !m.idle() && !msg.gaveUp:
		return false
	case !m.idle():
		msg.cl = unknownClass
	default:
		msg.cl = m.classifySettled(sql)
	}
	return true
}

// classifySettled classifies a text whose lexing depends on the settings,
// with the server's answers all in: unknown when a statement this batch
// ran may have changed them, which the server reports only at the batch's
// end, and the text lexes differently under another setting.
func (m *machine) classifySettled(sql []byte) *sqlclass.Class {
	set := m.lex
	cl := m.classifier.ClassifyBytes(sql, set)
	if !m.batchRan {
		return cl
	}
	others := []sqlclass.Settings{{BackslashEscapes: !set.BackslashEscapes, Encoding: set.Encoding}}
	if bytes.ContainsFunc(sql, func(r rune) bool { return r >= 0x80 }) {
		for _, e := range []sqlclass.Encoding{sqlclass.ASCIISafe, sqlclass.EncodingSJIS, sqlclass.EncodingDoubleByte,
			sqlclass.EncodingGB18030, sqlclass.EncodingJOHAB} {
			others = append(others, sqlclass.Settings{BackslashEscapes: set.BackslashEscapes, Encoding: e},
				sqlclass.Settings{BackslashEscapes: !set.BackslashEscapes, Encoding: e})
		}
	}
	for _, o := range others {
		if !sameClass(cl, sqlclass.ClassifyWith(string(sql), o)) {
			return unknownClass
		}
	}
	return cl
}

func sameClass(a, b *sqlclass.Class) bool {
	if len(a.Statements) != len(b.Statements) {
		return false
	}
	for i := range a.Statements {
		x, y := &a.Statements[i], &b.Statements[i]
		if x.Count != y.Count || x.Execute != y.Execute || x.Op != y.Op || x.Name != y.Name ||
			!slices.Equal(x.Kinds, y.Kinds) || !slices.Equal(x.Tables, y.Tables) {
			return false
		}
		if x.Prepared != nil && !sameClass(&sqlclass.Class{Statements: []sqlclass.Statement{*x.Prepared}},
			&sqlclass.Class{Statements: []sqlclass.Statement{*y.Prepared}}) {
			return false
		}
	}
	return true
}

// changesInFlight reports whether a change to prepared statements sent in
// an earlier batch is not confirmed yet: a message that touches prepared
// statements waits for the server to answer that batch first.
func (m *machine) changesInFlight() bool {
	u := m.names.undo
	return len(u) > 0 && u[0].batch < m.batches
}

// resolveName settles a message that touches the prepared statement name
// (changesInFlight); the unnamed one needs no wait. Given up, the message
// is unsettled: what name holds counts as unknown.
func (m *machine) resolveName(msg *clientMsg, name string) bool {
	if name == "" || !m.changesInFlight() {
		return true
	}
	msg.settled = false
	return msg.gaveUp
}

// parse follows a Parse of text classified as cl into the statement name;
// unsettled, what it holds is unknown.
func (m *machine) parse(name string, cl *sqlclass.Class, settled bool) {
	if !settled {
		cl = unknownClass
	}
	n := &m.names
	n.parses++
	if name == "" {
		// The server drops the unnamed statement before parsing a new one:
		// if the Parse fails, nothing of that name is left to run.
		n.stmts[""] = cl
		return
	}
	m.record(change{ack: ackParse, seq: n.parses, name: name, prev: n.stmts[name]})
	n.stmts[name] = cl
}

// bind follows a Bind of statement stmt into portal.
func (m *machine) bind(portal, stmt string, settled bool) {
	cl := m.names.stmts[stmt]
	if cl == nil || !settled {
		cl = unknownClass // the server will refuse it, or has a statement the proxy did not see made
	}
	m.setPortal(portal, cl)
}

func (m *machine) setPortal(portal string, cl *sqlclass.Class) {
	p := m.names.portals
	if _, ok := p[portal]; !ok && len(p) >= maxPortals {
		clear(p)
	}
	p[portal] = cl
}

// closeName follows a Close of a statement ('S') or portal ('P').
func (m *machine) closeName(kind byte, name string, settled bool) {
	n := &m.names
	n.closes++
	switch {
	case kind == 'S' && !settled:
		delete(n.stmts, name) // unconfirmed: forget the name rather than guess
	case kind == 'S':
		if prev, ok := n.stmts[name]; ok && name != "" {
			m.record(change{ack: ackClose, seq: n.closes, name: name, prev: prev})
		}
		delete(n.stmts, name)
	case kind == 'P':
		delete(n.portals, name)
	default:
		delete(n.stmts, name)
	}
}

// portal returns what portal runs; unknownClass for a portal the proxy did
// not see bound (a cursor DECLAREd in SQL, say).
func (m *machine) portal(name string) *sqlclass.Class {
	if cl := m.names.portals[name]; cl != nil {
		return cl
	}
	return unknownClass
}

// resolveRun works out what msg.cl runs and changes (running), once the
// prepared statements it may touch are settled (changesInFlight). Given
// up, a text that runs or changes prepared statements runs as unknown.
func (m *machine) resolveRun(msg *clientMsg) bool {
	switch {
	case plain(msg.cl):
		msg.run = msg.cl.Statements
	case !m.changesInFlight():
		msg.run, msg.changes = m.running(msg.cl)
	case msg.gaveUp:
		msg.run = unknownClass.Statements
	default:
		return false
	}
	return true
}

// plain reports whether cl neither runs nor changes prepared statements.
func plain(cl *sqlclass.Class) bool {
	for i := range cl.Statements {
		if s := &cl.Statements[i]; s.Execute != "" || s.Op != sqlclass.OpNone {
			return false
		}
	}
	return true
}

// running returns the statements of cl as they will run: an EXECUTE as the
// statement it executes, given the prepared statements as the statements
// before it leave them. It also returns the changes cl's statements make,
// to apply (commitChanges) once they are admitted.
func (m *machine) running(cl *sqlclass.Class) ([]sqlclass.Statement, []nameChange) {
	var changes []nameChange
	lookup := func(name string) *sqlclass.Statement {
		var p *sqlclass.Class
		found := false
		for i := len(changes) - 1; i >= 0 && !found; i-- {
			if ch := changes[i]; ch.all || ch.name == name {
				p, found = ch.value, true
			}
		}
		if !found {
			p = m.names.stmts[name]
		}
		if p == nil || len(p.Statements) != 1 {
			return nil
		}
		return &p.Statements[0]
	}
	run := make([]sqlclass.Statement, len(cl.Statements))
	for i := range cl.Statements {
		s := &cl.Statements[i]
		run[i] = *s
		if s.Execute != "" {
			run[i] = s.Executing(lookup(s.Execute))
		}
		switch s.Op {
		case sqlclass.OpPrepare:
			changes = append(changes, nameChange{name: s.Name, tag: "PREPARE",
				value: &sqlclass.Class{Statements: []sqlclass.Statement{*s.Prepared}}})
		case sqlclass.OpDeallocate:
			changes = append(changes, nameChange{name: s.Name, tag: "DEALLOCATE"})
		case sqlclass.OpDeallocateAll:
			changes = append(changes, nameChange{all: true, tag: "DEALLOCATE ALL"})
		case sqlclass.OpDiscardAll:
			changes = append(changes, nameChange{all: true, tag: "DISCARD ALL"})
		}
	}
	return run, changes
}

// commitChanges applies the changes of a Query or Execute about to be sent.
func (m *machine) commitChanges(changes []nameChange) {
	n := &m.names
	for _, ch := range changes {
		if ch.all {
			m.record(change{ack: ackTag, tag: ch.tag, all: n.stmts})
			n.stmts = make(map[string]*sqlclass.Class)
			continue
		}
		m.record(change{ack: ackTag, tag: ch.tag, name: ch.name, prev: n.stmts[ch.name]})
		if ch.value == nil {
			delete(n.stmts, ch.name)
		} else {
			n.stmts[ch.name] = ch.value
		}
	}
}

// record notes a change about to be applied, in the batch being built.
func (m *machine) record(ch change) {
	ch.batch = m.batches
	m.names.undo = append(m.names.undo, ch)
}

// undoBatch undoes the unconfirmed changes of the batch the server is
// answering, newest first: the server refused or skipped them.
func (m *machine) undoBatch() {
	n := &m.names
	end := 0
	for end < len(n.undo) && n.undo[end].batch == m.done {
		end++
	}
	for i := end - 1; i >= 0; i-- {
		ch := n.undo[i]
		switch {
		case ch.all != nil:
			n.stmts = ch.all
		case ch.prev == nil:
			delete(n.stmts, ch.name)
		default:
			n.stmts[ch.name] = ch.prev
		}
	}
	n.undo = n.undo[end:]
}

// confirm drops the changes the server has confirmed.
func (m *machine) confirm() {
	n := &m.names
	i := 0
	for ; i < len(n.undo); i++ {
		ch := n.undo[i]
		if !(ch.ack == ackParse && ch.seq <= n.parsed) && !(ch.ack == ackClose && ch.seq <= n.closed) {
			break
		}
	}
	n.undo = n.undo[i:]
}

// noteAck follows the server's messages that confirm changes:
// ParseComplete, CloseComplete, and a CommandComplete (body, its tag).
func (m *machine) noteAck(t MsgType, body []byte) {
	m.countAck(t)
	u := m.names.undo
	if len(u) == 0 {
		return
	}
	if t == MsgCommandComplete && u[0].ack == ackTag && u[0].tag == string(bytes.TrimRight(body, "\x00")) {
		m.names.undo = u[1:]
	}
	m.confirm()
}

// countAck counts a ParseComplete or CloseComplete.
func (m *machine) countAck(t MsgType) {
	switch t {
	case MsgParseComplete:
		m.names.parsed++
	case MsgCloseComplete:
		m.names.closed++
	}
}

// noteAnswered follows the ReadyForQuery that ends a Query or batch
// (whose entry was p).
func (m *machine) noteAnswered(p pending) {
	m.undoBatch() // left unconfirmed: they never happened
	m.done++
	n := &m.names
	// Messages skipped after an error are answered by nothing: count them
	// as answered.
	n.parsed, n.closed = max(n.parsed, p.parses), max(n.closed, p.closes)
	if m.status == TxIdle && len(m.queue) == 0 && !m.inBatch && len(n.portals) > 1 {
		// Portals end with their transaction.
		clear(n.portals)
	}
}
