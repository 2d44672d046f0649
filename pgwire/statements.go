package pgwire

import (
	"bytes"
	"slices"
	"time"

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

// names is the connection's view of the server's prepared statements and
// portals. Guarded by conn.mu.
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

// lexSettings are the server's settings that change lexing, as last
// reported.
func (c *conn) lexSettings() sqlclass.Settings {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lex
}

// noteParameter follows a ParameterStatus from the server.
func (c *conn) noteParameter(body []byte) {
	name, rest, ok := cstring(body)
	value, _, ok2 := cstring(rest)
	if !ok || !ok2 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch name {
	case "standard_conforming_strings":
		c.lex.BackslashEscapes = value != "on"
	case "client_encoding":
		c.lex.Encoding = sqlclass.EncodingOf(value)
	}
}

// classifyText classifies a Query's or Parse's text as the server will lex
// it.
func (c *conn) classifyText(sql []byte) *sqlclass.Class {
	if !sqlclass.DependsOnSettings(sql) {
		return c.p.cache.ClassifyBytes(sql, c.lexSettings())
	}
	if !c.settle() {
		return unknownClass
	}
	set := c.lexSettings()
	cl := c.p.cache.ClassifyBytes(sql, set)
	c.mu.Lock()
	ran := c.batchRan
	c.mu.Unlock()
	if !ran {
		return cl
	}
	// A statement this batch ran may have changed the settings; the server
	// reports that only at the batch's end.
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

// settle waits until the server has answered every Query, FunctionCall and
// Sync sent so far, so that what it reported on the way (ParameterStatus,
// confirmations, errors) is known. It gives up after the wait timeout, or
// when the connection ends, and then reports false.
func (c *conn) settle() bool {
	c.mu.Lock()
	idle := len(c.queue) == 0
	c.mu.Unlock()
	if idle {
		return true
	}
	if err := c.sw.Flush(); err != nil {
		return false
	}
	timer := time.NewTimer(c.p.waitTimeout())
	defer timer.Stop()
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.mu.Unlock()
			return true
		}
		if c.answered == nil {
			c.answered = make(chan struct{})
		}
		ch := c.answered
		c.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return false
		case <-c.ctx.Done():
			return false
		}
	}
}

// settleNames settles the connection when a change sent in an earlier batch
// is not confirmed yet; a message that touches prepared statements calls it
// first.
func (c *conn) settleNames() bool {
	c.mu.Lock()
	early := len(c.names.undo) > 0 && c.names.undo[0].batch < c.batches
	c.mu.Unlock()
	return !early || c.settle()
}

// parse follows a Parse of text classified as cl into the statement name.
func (c *conn) parse(name string, cl *sqlclass.Class) {
	if name != "" && !c.settleNames() {
		cl = unknownClass
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := &c.names
	n.parses++
	if name == "" {
		// The server drops the unnamed statement before parsing a new one:
		// if the Parse fails, nothing of that name is left to run.
		n.stmts[""] = cl
		return
	}
	c.record(change{ack: ackParse, seq: n.parses, name: name, prev: n.stmts[name]})
	n.stmts[name] = cl
}

// bind follows a Bind of statement stmt into portal.
func (c *conn) bind(portal, stmt string) {
	if stmt != "" && !c.settleNames() {
		c.mu.Lock()
		c.setPortal(portal, unknownClass)
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.names.stmts[stmt]
	if cl == nil {
		cl = unknownClass // the server will refuse it, or has a statement the proxy did not see made
	}
	c.setPortal(portal, cl)
}

func (c *conn) setPortal(portal string, cl *sqlclass.Class) {
	p := c.names.portals
	if _, ok := p[portal]; !ok && len(p) >= maxPortals {
		clear(p)
	}
	p[portal] = cl
}

// closeName follows a Close of a statement ('S') or portal ('P').
func (c *conn) closeName(kind byte, name string) {
	if kind == 'S' && name != "" && !c.settleNames() {
		kind = 0 // unconfirmed: forget the name rather than guess
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := &c.names
	n.closes++
	switch kind {
	case 'S':
		if prev, ok := n.stmts[name]; ok && name != "" {
			c.record(change{ack: ackClose, seq: n.closes, name: name, prev: prev})
		}
		delete(n.stmts, name)
	case 'P':
		delete(n.portals, name)
	default:
		delete(n.stmts, name)
	}
}

// portal returns what portal runs; unknownClass for a portal the proxy did
// not see bound (a cursor DECLAREd in SQL, say).
func (c *conn) portal(name string) *sqlclass.Class {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.names.portals[name]; cl != nil {
		return cl
	}
	return unknownClass
}

// running returns the statements of cl as they will run: an EXECUTE as the
// statement it executes, given the prepared statements as the statements
// before it leave them. It also returns the changes cl's statements make,
// to apply (commitChanges) once they are admitted. A text with neither is
// returned as it is.
func (c *conn) running(cl *sqlclass.Class) ([]sqlclass.Statement, []nameChange) {
	plain := true
	for i := range cl.Statements {
		if s := &cl.Statements[i]; s.Execute != "" || s.Op != sqlclass.OpNone {
			plain = false
			break
		}
	}
	if plain {
		return cl.Statements, nil
	}
	if !c.settleNames() {
		return unknownClass.Statements, nil
	}
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
			c.mu.Lock()
			p = c.names.stmts[name]
			c.mu.Unlock()
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
func (c *conn) commitChanges(changes []nameChange) {
	if len(changes) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := &c.names
	for _, ch := range changes {
		if ch.all {
			c.record(change{ack: ackTag, tag: ch.tag, all: n.stmts})
			n.stmts = make(map[string]*sqlclass.Class)
			continue
		}
		c.record(change{ack: ackTag, tag: ch.tag, name: ch.name, prev: n.stmts[ch.name]})
		if ch.value == nil {
			delete(n.stmts, ch.name)
		} else {
			n.stmts[ch.name] = ch.value
		}
	}
}

// record notes a change about to be applied, in the batch being built.
// Called with c.mu held.
func (c *conn) record(ch change) {
	ch.batch = c.batches
	c.names.undo = append(c.names.undo, ch)
	c.unconfirmed.Store(int32(len(c.names.undo)))
}

// undoBatch undoes the unconfirmed changes of the batch the server is
// answering, newest first: the server refused or skipped them. Called with
// c.mu held.
func (c *conn) undoBatch() {
	n := &c.names
	end := 0
	for end < len(n.undo) && n.undo[end].batch == c.done {
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
	c.unconfirmed.Store(int32(len(n.undo)))
}

// confirm drops the changes the server has confirmed. Called with c.mu
// held.
func (c *conn) confirm() {
	n := &c.names
	i := 0
	for ; i < len(n.undo); i++ {
		ch := n.undo[i]
		if !(ch.ack == ackParse && ch.seq <= n.parsed) && !(ch.ack == ackClose && ch.seq <= n.closed) {
			break
		}
	}
	n.undo = n.undo[i:]
	c.unconfirmed.Store(int32(len(n.undo)))
}

// noteServer follows the server's messages that confirm or refuse changes
// and report settings. The relay streams them on; noteServer only peeks at
// bodies it needs, which are small.
func (c *conn) noteServer(t MsgType, n int) {
	switch t {
	case MsgParameterStatus:
		if body, err := c.sr.Peek(n); err == nil {
			c.noteParameter(body)
		}
	case MsgParseComplete, MsgCloseComplete, MsgCommandComplete:
		if c.unconfirmed.Load() == 0 {
			if t != MsgCommandComplete {
				c.mu.Lock()
				c.countAck(t)
				c.mu.Unlock()
			}
			return
		}
		var tag []byte
		if t == MsgCommandComplete {
			body, err := c.sr.Peek(n)
			if err != nil {
				return
			}
			tag = bytes.TrimRight(body, "\x00")
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.countAck(t)
		if u := c.names.undo; t == MsgCommandComplete && len(u) > 0 && u[0].ack == ackTag && u[0].tag == string(tag) {
			c.names.undo = u[1:]
		}
		c.confirm()
	}
}

// countAck counts a ParseComplete or CloseComplete. Called with c.mu held.
func (c *conn) countAck(t MsgType) {
	switch t {
	case MsgParseComplete:
		c.names.parsed++
	case MsgCloseComplete:
		c.names.closed++
	}
}

// noteError follows an ERROR from the server: the rest of its Query or
// batch is skipped, and with it the changes not yet confirmed.
func (c *conn) noteError() {
	if c.unconfirmed.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.undoBatch()
}

// noteAnswered follows the ReadyForQuery that ends a Query or batch
// (whose entry was p). Called with c.mu held.
func (c *conn) noteAnswered(p *pending) {
	c.undoBatch() // left unconfirmed: they never happened
	c.done++
	n := &c.names
	// Messages skipped after an error are answered by nothing: count them
	// as answered.
	n.parsed, n.closed = max(n.parsed, p.parses), max(n.closed, p.closes)
	if len(c.queue) == 0 && c.answered != nil {
		close(c.answered)
		c.answered = nil
	}
	if c.status == TxIdle && len(c.queue) == 0 && !c.inBatch && len(n.portals) > 1 {
		// Portals end with their transaction.
		clear(n.portals)
	}
}
