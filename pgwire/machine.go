package pgwire

import (
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/classify/sqlclass"
)

// A connection's protocol logic is a machine: decoded messages in, actions
// out, no I/O, no clock, no goroutine. It decides what each message runs
// (classified as the server will lex it, with the prepared statements as
// the server will have them), what it does to the transaction (which
// ReadyForQuery ends it, when its leases end), what is asked of admission
// and what a denial becomes on both legs; and, before that, what the
// startup and login exchange is answered (login.go). conn is the shell
// that reads, frames, admits and writes.
//
// The shell's duties, in order:
//
//  1. Feed the machine under conn.mu: it is not safe for concurrent use,
//     and both legs' goroutines feed it. A client message the machine
//     drops (drops) is not read into memory at all.
//  2. Carry out the actions in the order returned, outside conn.mu where
//     they block. An actEnd comes before the ReadyForQuery it precedes is
//     forwarded: a client that starts its next transaction at once, on
//     any connection, must find the slot free. What the server's side
//     writes to the client is queued on the client's writer before
//     conn.mu is released, so that what the client's side writes on a
//     later action (a denial answered alone) follows it.
//  3. On actAsk (always the last action), ask admission and feed its
//     answer (answered) before the next client message. Meanwhile the
//     server's messages go on being fed; no ReadyForQuery ends the leases
//     the message asked about counts on.
//  4. On actAwait (always the last action), flush what went to the server
//     and wait for an actWake from the server's side, then feed resumed;
//     or give up after the wait timeout, or when the connection ends, and
//     feed resumed(true). A message waits so when what it runs depends on
//     what the server has yet to answer (statements.go).
//  5. What the client goroutine sends the client (actClient) is flushed at
//     once; what the server goroutine sends is flushed when the server has
//     nothing more buffered.
//  6. When either side ends, feed ended and end what it returns.

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
	actAwait                  // wait for actWake, then feed resumed (duty 4)
	actWake                   // wake the client's side from its actAwait

	// Before the relay (login.go).
	actTLS      // answer the SSLRequest with data ('S') and take the client's TLS handshake
	actCancel   // serve the CancelRequest data, and end the connection
	actDial     // connect to the server for a client with params; feed dialed
	actReadAuth // flush the client's side, read its answer to authentication, feed it
	actRegister // hand the client a key of the proxy's for the server's BackendKeyData body (data)
	actLoggedIn // the login is done: the relay starts (unless the proxy is closing)
	actFail     // the connection fails with err, counted as failure; data, if any, is the client's FATAL
)

// action is one thing the shell does. The slice of actions, data and ask
// are read before the next input from the same side; end is the shell's.
type action struct {
	kind       actKind
	data       []byte // actServer, actClient, and see actKind
	ask        admitReq
	end        []heldTicket
	overloaded bool
	results    []*resultCharge
	params     map[string]string // actDial
	failure    Failure           // actFail
	err        error             // actFail
}

// admitReq is what a message asks admission about: its class and the
// statements it runs. A Query decided by its connection alone
// (byConnection) is not classified for its lease; when admission needs to
// know whether it writes, the shell feeds classified, and the ask comes
// again with run filled and classified set.
type admitReq struct {
	cl         *sqlclass.Class
	run        []sqlclass.Statement
	classified bool
	// noticeDue: the transaction has had no NOTICE of a cap yet
	// (notice.go).
	noticeDue bool
}

// verdict is admission's answer to an ask.
type verdict struct {
	deny   []byte       // the ErrorResponse of a denial; nil when admitted
	grants []heldTicket // the leases granted: all that were asked for
	// result is the charge of what the message's statements return,
	// when a rule counts it (result.go).
	result *resultCharge
	// wrote: the transaction's leases count as taken for writes from now
	// on (checkWrite); noticed: the transaction has had its NOTICE.
	wrote, noticed bool
}

// clientMsg is a client's message as the shell frames it; types the proxy
// does not decode carry only t.
type clientMsg struct {
	t MsgType
	// Query, Parse: the SQL, in the shell's buffer: it stays there until
	// the machine is done with the message (the shell reads nothing more
	// from the client meanwhile).
	text []byte
	// Parse: name; Bind: name (the portal) and stmt; Execute: name (the
	// portal); Close: kind ('S', 'P'; 0 for a Close too short to name
	// anything) and name.
	name, stmt string
	kind       byte
	// byConn: a Query the rules in force decide by its connection alone,
	// without a charge, so that its text need not be classified
	// (byConnection).
	byConn bool
	lexed  bool // and it is classified all the same (classified)

	// What the machine works out it runs (resolve). cl is nil when the
	// proxy governs nothing.
	cl      *sqlclass.Class
	run     []sqlclass.Statement
	changes []nameChange // to the prepared statements, made once admitted
	// settled is false when a name is touched while a change to prepared
	// statements sent in an earlier batch is unconfirmed and the wait for
	// it was given up: what the name holds is then unknown.
	settled bool
	gaveUp  bool // the wait for the server was given up (resumed)
}

// textClassifier classifies a text as the server lexes it under s; the
// Proxy's cache, or sqlclass.ClassifyWith in the traces.
type textClassifier interface {
	ClassifyBytes(sql []byte, s sqlclass.Settings) *sqlclass.Class
}

// pending is a ReadyForQuery the server owes the client. deny, when set, is
// the denial to show instead of the server's error for denyStatement.
// parses and closes count the Parse and Close messages sent up to it.
type pending struct {
	deny           []byte
	parses, closes uint64
	results        []*resultCharge // what the message's statements return is charged to (result.go)
}

// denyMarker is in the text of the statement the proxy sends the server in
// place of a denied one (see denyStatement); the server's error for it is
// recognised by this marker and replaced by the denial.
const denyMarker = "governor-proxy: statement denied"

// denyStatement fails on the server without touching anything: the cast of
// a constant fails during parse analysis (22P02), which aborts an open
// transaction, so a later COMMIT rolls back. It needs no function, schema
// or language, and it names itself in the server's log.
const denyStatement = "SELECT '" + denyMarker + "'::pg_catalog.int4"

// The messages the proxy sends the server in place of a denied one.
var (
	denyQuery, _ = (&pgproto3.Query{String: denyStatement}).Encode(nil)
	denyParse, _ = (&pgproto3.Parse{Query: denyStatement}).Encode(nil)
)

// machine is the connection's protocol state.
type machine struct {
	governs    bool           // the proxy classifies and follows prepared statements
	classifier textClassifier // when it governs
	login      loginState     // until the first ReadyForQuery (login.go)

	status   byte      // from the last ReadyForQuery
	queue    []pending // one per ReadyForQuery the server owes, oldest first
	inBatch  bool      // extended-protocol messages sent since the last Sync
	batchRan bool      // an Execute was sent since the last Sync
	asking   bool      // a message's admission is asked and not answered
	waiting  bool      // a message waits for the server's answers (actAwait)
	woken    bool      // and its actWake is out
	held     clientMsg // that message

	capNoticed bool // the transaction has had its NOTICE of a cap (notice.go)

	discarding  bool   // after a denial in the extended protocol, until Sync
	pendingDeny []byte // that denial, for the Sync's ReadyForQuery

	// saidFatal: the server's last ErrorResponse was FATAL or PANIC, so
	// that the client needs no FATAL of the proxy's when the server's
	// side ends (lifecycle.go).
	saidFatal bool

	tickets    []heldTicket // the transaction's leases, one per class (govern.go)
	overloaded bool         // the server reported overload during them

	// Results charged (result.go): those of the Executes sent since the
	// last Sync.
	batchResults []*resultCharge

	// What the statements run (statements.go).
	lex     sqlclass.Settings // how the server lexes text, from ParameterStatus
	names   names             // its prepared statements and portals
	batches uint64            // Queries, FunctionCalls and Syncs sent, each owed a ReadyForQuery
	done    uint64            // ReadyForQuery received for them

	cacts, sacts []action // the actions returned, per side, reused
}

// newMachine returns the machine of a connection that governs its
// statements (classified by cl) unless cl is nil, and whose startup may
// switch to TLS when tlsOffered.
func newMachine(cl textClassifier, tlsOffered bool) *machine {
	return &machine{
		governs:    cl != nil,
		classifier: cl,
		login:      loginState{tlsOffered: tlsOffered},
		status:     TxIdle,
		names:      names{stmts: make(map[string]*sqlclass.Class), portals: make(map[string]*sqlclass.Class)},
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
	if m.login.phase != phaseRelay {
		return m.loginClient(msg)
	}
	if m.drops(msg.t) {
		return m.cact(action{kind: actDrop})
	}
	return m.take(msg)
}

// take works out what msg runs and acts on it; or holds it until the
// server has answered what it depends on.
func (m *machine) take(msg clientMsg) []action {
	if !m.resolve(&msg) {
		m.waiting, m.held = true, msg
		return m.cact(action{kind: actAwait})
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

// resumed takes the end of an actAwait: the server has answered what the
// message held waited for, or the shell gave up waiting (gaveUp), and
// what the server has still not answered counts as unknown.
func (m *machine) resumed(gaveUp bool) []action {
	m.cacts = m.cacts[:0]
	msg := m.held
	m.held, m.waiting, m.woken = clientMsg{}, false, false
	msg.gaveUp = msg.gaveUp || gaveUp
	return m.take(msg)
}

// ask holds msg for admission. From here until it is sent, a
// ReadyForQuery for an earlier message must not end the leases it counts
// on.
func (m *machine) ask(msg clientMsg) []action {
	m.asking, m.held = true, msg
	if m.status == TxIdle {
		m.capNoticed = false // a new transaction
	}
	q := admitReq{cl: msg.cl, run: msg.run, classified: !msg.byConn || msg.lexed, noticeDue: !m.capNoticed}
	return m.cact(action{kind: actAsk, ask: q})
}

// classified takes the shell's question about the message asked about,
// when it was decided by its connection alone: what does it run (does it
// write)? The ask comes again with the message classified; or the message
// waits for the server first.
func (m *machine) classified() []action {
	m.cacts = m.cacts[:0]
	msg := m.held
	m.held, m.asking = clientMsg{}, false
	msg.lexed = true
	return m.take(msg)
}

// answered takes admission's verdict on the message held.
func (m *machine) answered(v verdict) []action {
	h := m.held
	m.held, m.asking = clientMsg{}, false
	m.cacts = m.cacts[:0]
	m.capNoticed = m.capNoticed || v.noticed
	if v.wrote {
		for i := range m.tickets {
			m.tickets[i].write = true
		}
	}
	if v.deny == nil {
		m.admitted(h, v)
		return m.cact(action{kind: actForward})
	}
	return m.denied(h.t, v.deny)
}

// admitted follows an admitted message about to be sent: its leases, its
// changes to prepared statements, its result's charge.
func (m *machine) admitted(h clientMsg, v verdict) {
	for _, g := range v.grants {
		if len(m.tickets) == 0 {
			m.overloaded = false
		}
		m.tickets = append(m.tickets, g)
	}
	m.commitChanges(h.changes)
	if h.t == MsgExecute {
		m.batchRan = true
		if v.result != nil {
			m.batchResults = append(m.batchResults, v.result)
		}
		return
	}
	m.expect(nil)
	if v.result != nil {
		m.queue[len(m.queue)-1].results = []*resultCharge{v.result}
	}
}

// denied shows the client a denial of a message of type t, and keeps the
// server in step.
func (m *machine) denied(t MsgType, deny []byte) []action {
	if t == MsgExecute {
		// The server must fail the batch too, so that it skips to Sync
		// as the client expects: it gets a Parse that fails.
		m.discarding, m.pendingDeny = true, deny
		m.names.parses++
		return m.cact(action{kind: actServer, data: denyParse})
	}
	if m.idle() && m.status == TxIdle && !m.inBatch && len(m.tickets) == 0 {
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
	if m.login.phase != phaseRelay {
		return m.loginServer(t, body)
	}
	m.serve(t, body)
	if m.waiting && !m.woken && m.idle() {
		// Last: the client's side, woken, may write to the client, after
		// what this message forwards.
		m.woken = true
		m.sacts = append(m.sacts, action{kind: actWake})
	}
	return m.sacts
}

// serve follows a server's message after login.
func (m *machine) serve(t MsgType, body []byte) {
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
		m.saidFatal = fatal(body)
		if d := m.serverError(body); d != nil {
			m.sact(action{kind: actClient, data: d})
			return
		}
	case MsgParameterStatus:
		m.noteParameter(body)
	case MsgParseComplete, MsgCloseComplete, MsgCommandComplete:
		m.noteAck(t, body)
	}
	m.sact(action{kind: actForward})
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

func (m *machine) cact(a action) []action {
	m.cacts = append(m.cacts, a)
	return m.cacts
}

func (m *machine) sact(a action) []action {
	m.sacts = append(m.sacts, a)
	return m.sacts
}
