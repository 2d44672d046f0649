package pgwire

import (
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/classify/sqlclass"
)

// A connection's protocol logic after login is a machine: decoded messages
// in, actions out, no I/O, no clock, no goroutine. It decides what each
// message does to the transaction (which ReadyForQuery ends it, when its
// leases end), what is asked of admission and what a denial becomes on
// both legs; conn is the shell that reads, classifies, admits and writes.
//
// The shell's duties, in order:
//
//  1. Feed the machine under conn.mu: it is not safe for concurrent use,
//     and both legs' goroutines feed it. A client message the machine
//     drops (drops) is not read into memory at all.
//  2. Carry out the actions in the order returned, outside conn.mu where
//     they block. An actEnd comes before the ReadyForQuery it precedes is
//     forwarded: a client that starts its next transaction at once, on
//     any connection, must find the slot free.
//  3. On actAsk (always the last action), ask admission and feed its
//     answer (answered) before the next client message. Meanwhile the
//     server's messages go on being fed; no ReadyForQuery ends the leases
//     the message asked about counts on.
//  4. What the client goroutine sends the client (actClient) is flushed at
//     once; what the server goroutine sends is flushed when the server has
//     nothing more buffered.
//  5. When either side ends, feed ended and end what it returns.

// actKind is what an action does.
type actKind uint8

const (
	actForward actKind = iota // pass the message on to the other side, as it came
	actDrop                   // drop the client's message: after a denial in a batch, until Sync
	actServer                 // send data to the server, in the message's place
	actClient                 // send data to the client, in the message's place
	actAsk                    // ask admission about the message (ask); feed the answer to answered
	actEnd                    // end the transaction's leases (end, overloaded)
	actSettle                 // charge and settle what messages' results owe (results, result.go)
)

// action is one thing the shell does. The slice of actions, data and ask
// are read before the next input from the same side; end is the shell's.
type action struct {
	kind       actKind
	data       []byte // actServer, actClient
	ask        admitReq
	end        []heldTicket
	overloaded bool
	results    []*resultCharge
}

// admitReq is what a message asks admission about: its class, the
// statements it runs, and for a Query its text, from which whether it
// writes is read when its class is decided by the connection alone.
type admitReq struct {
	cl   *sqlclass.Class
	run  []sqlclass.Statement
	text []byte
}

// clientMsg is a client's message as the machine needs it. Types the proxy
// does not decode carry only t.
type clientMsg struct {
	t MsgType
	// Query, FunctionCall, Execute: what it runs; cl nil when the proxy
	// governs nothing, or for a Parse whose text is not classified.
	cl      *sqlclass.Class
	run     []sqlclass.Statement
	changes []nameChange // to the prepared statements, made once admitted
	text    []byte       // a Query's text
	// Parse: name; Bind: name (the portal) and stmt; Close: kind ('S',
	// 'P'; 0 for a Close too short to name anything) and name.
	name, stmt string
	kind       byte
	// settled is false when a change to prepared statements sent in an
	// earlier batch is still unconfirmed and a name is touched: the machine
	// then counts what the name holds as unknown.
	settled bool
}

// pending is a ReadyForQuery the server owes the client. deny, when set, is
// the denial to show instead of the server's error for denyStatement.
// parses and closes count the Parse and Close messages sent up to it.
type pending struct {
	deny           []byte
	parses, closes uint64
	results        []*resultCharge // what the message's statements return is charged to (result.go)
}

// The messages the proxy sends the server in place of a denied one.
var (
	denyQuery, _ = (&pgproto3.Query{String: denyStatement}).Encode(nil)
	denyParse, _ = (&pgproto3.Parse{Query: denyStatement}).Encode(nil)
)

// machine is the connection's protocol state.
type machine struct {
	governs bool // the proxy classifies and follows prepared statements

	status   byte      // from the last ReadyForQuery
	queue    []pending // one per ReadyForQuery the server owes, oldest first
	inBatch  bool      // extended-protocol messages sent since the last Sync
	batchRan bool      // an Execute was sent since the last Sync
	asking   bool      // a message's admission is asked and not answered
	held     clientMsg // that message

	discarding  bool   // after a denial in the extended protocol, until Sync
	pendingDeny []byte // that denial, for the Sync's ReadyForQuery

	tickets    []heldTicket // the transaction's leases, one per class (govern.go)
	overloaded bool         // the server reported overload during them

	// Results charged (result.go): nextResult is the charge of the message
	// being admitted, set by the shell before answered; batchResults those
	// of the Executes sent since the last Sync.
	nextResult   *resultCharge
	batchResults []*resultCharge

	// What the statements run (statements.go).
	lex     sqlclass.Settings // how the server lexes text, from ParameterStatus
	names   names             // its prepared statements and portals
	batches uint64            // Queries, FunctionCalls and Syncs sent, each owed a ReadyForQuery
	done    uint64            // ReadyForQuery received for them

	cacts, sacts []action // the actions returned, per side, reused
}

func newMachine(governs bool) *machine {
	return &machine{
		governs: governs,
		status:  TxIdle,
		names:   names{stmts: make(map[string]*sqlclass.Class), portals: make(map[string]*sqlclass.Class)},
	}
}

// drops reports whether the client's next message of type t is dropped
// unread: after a denial in a batch, everything up to Sync is (Flush is
// passed on, Terminate ends the connection).
func (m *machine) drops(t MsgType) bool {
	return m.discarding && t != MsgSync && t != MsgTerminate && t != MsgFlush
}

// client takes a client's message.
func (m *machine) client(msg clientMsg) []action {
	m.cacts = m.cacts[:0]
	if m.drops(msg.t) {
		return m.cact(action{kind: actDrop})
	}
	switch msg.t {
	case MsgQuery, MsgFunctionCall:
		if msg.cl != nil {
			return m.ask(msg)
		}
		m.expect(nil)
	case MsgExecute:
		m.inBatch = true
		if msg.cl != nil {
			return m.ask(msg)
		}
		m.batchRan = true
	case MsgParse:
		if msg.cl != nil {
			m.parse(msg.name, msg.cl, msg.settled)
		}
		m.inBatch = true
	case MsgBind:
		if m.governs {
			m.bind(msg.name, msg.stmt, msg.settled)
		}
		m.inBatch = true
	case MsgClose:
		if m.governs && msg.kind != 0 {
			m.closeName(msg.kind, msg.name, msg.settled)
		}
		m.inBatch = true
	case MsgDescribe:
		m.inBatch = true
	case MsgSync:
		m.expect(m.pendingDeny)
		m.discarding, m.pendingDeny = false, nil
	}
	return m.cact(action{kind: actForward})
}

// ask holds msg for admission. From here until it is sent, a
// ReadyForQuery for an earlier message must not end the leases it counts
// on.
func (m *machine) ask(msg clientMsg) []action {
	m.asking, m.held = true, msg
	return m.cact(action{kind: actAsk, ask: admitReq{cl: msg.cl, run: msg.run, text: msg.text}})
}

// answered takes admission's answer to the message held: the leases it
// granted (all it asked for), or the ErrorResponse of its denial.
func (m *machine) answered(deny []byte, grants []heldTicket) []action {
	h, rc := m.held, m.nextResult
	m.held, m.asking, m.nextResult = clientMsg{}, false, nil
	m.cacts = m.cacts[:0]
	if deny == nil {
		for _, g := range grants {
			if len(m.tickets) == 0 {
				m.overloaded = false
			}
			m.tickets = append(m.tickets, g)
		}
		m.commitChanges(h.changes)
		if h.t == MsgExecute {
			m.batchRan = true
			if rc != nil {
				m.batchResults = append(m.batchResults, rc)
			}
		} else {
			m.expect(nil)
			if rc != nil {
				m.queue[len(m.queue)-1].results = []*resultCharge{rc}
			}
		}
		return m.cact(action{kind: actForward})
	}
	if h.t == MsgExecute {
		// The server must fail the batch too, so that it skips to Sync
		// as the client expects: it gets a Parse that fails.
		m.discarding, m.pendingDeny = true, deny
		m.names.parses++
		return m.cact(action{kind: actServer, data: denyParse})
	}
	if len(m.queue) == 0 && m.status == TxIdle && !m.inBatch && len(m.tickets) == 0 {
		// Idle with nothing in flight: the proxy answers alone.
		return m.cact(action{kind: actClient, data: append(deny, readyForQuery(TxIdle)...)})
	}
	// The server must agree on the transaction's state, and its answers
	// stay in order: it gets denyStatement, whose error becomes the denial.
	m.expect(deny)
	return m.cact(action{kind: actServer, data: denyQuery})
}

// server takes a server's message. The machine reads the bodies of
// ReadyForQuery, ErrorResponse, ParameterStatus and CommandComplete;
// other messages are forwarded.
func (m *machine) server(t MsgType, body []byte) []action {
	m.sacts = m.sacts[:0]
	switch t {
	case MsgReadyForQuery:
		m.status = body[0]
		if len(m.queue) > 0 {
			p := m.queue[0]
			m.queue = m.queue[:copy(m.queue, m.queue[1:])]
			m.noteAnswered(p)
			if len(p.results) > 0 {
				m.sacts = append(m.sacts, action{kind: actSettle, results: p.results})
			}
		}
		m.detach(false)
	case MsgErrorResponse:
		if d := m.serverError(body); d != nil {
			return m.sact(action{kind: actClient, data: d})
		}
	case MsgParameterStatus:
		m.noteParameter(body)
	case MsgParseComplete, MsgCloseComplete, MsgCommandComplete:
		m.noteAck(t, body)
	}
	return m.sact(action{kind: actForward})
}

// serverError notes an error's SQLSTATE for the leases' report and returns
// the denial to show instead, when the error is the server's answer to
// denyStatement (or, in a transaction it aborted, to what followed).
func (m *machine) serverError(body []byte) []byte {
	code, msg := errorFields(body)
	if len(m.tickets) > 0 && overloadedCode(code) {
		m.overloaded = true
	}
	if len(m.names.undo) > 0 {
		m.undoBatch() // the rest of the Query or batch is skipped
	}
	if len(m.queue) > 0 {
		if p := &m.queue[0]; p.deny != nil && (strings.Contains(msg, denyMarker) || code == "25P02") {
			d := p.deny
			p.deny = nil
			return d
		}
	}
	return nil
}

// ended takes the end of the connection, on either side: the leases end,
// whatever the transaction's state.
func (m *machine) ended() []action {
	m.sacts = m.sacts[:0]
	results := m.batchResults
	for _, p := range m.queue {
		results = append(results, p.results...)
	}
	if len(results) > 0 {
		m.sacts = append(m.sacts, action{kind: actSettle, results: results})
	}
	for i := range m.queue {
		m.queue[i].results = nil
	}
	m.batchResults = nil
	m.detach(true)
	return m.sacts
}

// dataRow counts a DataRow of n bytes to the result of the message the
// server is answering, if it is charged: the oldest owed a ReadyForQuery,
// or, with none owed, the first Execute of the batch not yet synced. It
// returns that result when a chunk of it is due to be charged.
func (m *machine) dataRow(n int) *resultCharge {
	var rcs []*resultCharge
	if len(m.queue) > 0 {
		rcs = m.queue[0].results
	} else {
		rcs = m.batchResults
	}
	if len(rcs) == 0 || !rcs[0].counted(n) {
		return nil
	}
	return rcs[0]
}

// detach ends the transaction's leases when the connection is idle (or,
// with dropped, regardless), as an action on the server's side.
func (m *machine) detach(dropped bool) {
	if len(m.tickets) == 0 || (!dropped && (m.status != TxIdle || len(m.queue) > 0 || m.inBatch || m.asking)) {
		return
	}
	m.sacts = append(m.sacts, action{kind: actEnd, end: m.tickets, overloaded: m.overloaded})
	m.tickets = nil
}

// expect records that the server owes a ReadyForQuery for the message about
// to be sent (a Query, FunctionCall or Sync). It is recorded before the
// message goes out, so the answer cannot overtake it.
func (m *machine) expect(deny []byte) {
	m.queue = append(m.queue, pending{deny: deny, parses: m.names.parses, closes: m.names.closes, results: m.batchResults})
	m.batchResults = nil
	m.batches++
	m.inBatch, m.batchRan = false, false
}

// idle reports whether the server owes nothing.
func (m *machine) idle() bool { return len(m.queue) == 0 }

// markWrite records that the transaction's leases count as taken for
// writes (checkWrite).
func (m *machine) markWrite() {
	for i := range m.tickets {
		m.tickets[i].write = true
	}
}

func (m *machine) cact(a action) []action {
	m.cacts = append(m.cacts, a)
	return m.cacts
}

func (m *machine) sact(a action) []action {
	m.sacts = append(m.sacts, a)
	return m.sacts
}
