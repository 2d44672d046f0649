package pgwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/classify/sqlclass"
)

// The machine's traces (testdata/machine/*.txt): client and server
// messages and admission's answers in, the actions expected out. A trace
// file is blocks of a directive line, input lines, "----" and the expected
// output, ended by a blank line; "#" starts a comment between blocks.
//
//	new [passthrough] [login] [tls]
//	                    a fresh machine, governed unless passthrough; logged
//	                    in unless login, when it starts at the startup
//	                    packets (an SSLRequest answered with TLS if tls)
//	trace               each input line, then its actions, indented
//	state               the machine's state
//
// Inputs: client <Message> [args], server <Message> [args],
// admission granted [class...] [+result] [wrote] [noticed], admission
// denied <SQLSTATE> "<message>", admission classify (the shell asks what
// a message decided by its connection runs), resumed, gave up (the end of
// an actAwait), backend gone; and before login: startup <packet> [args],
// dialed [tls]. Strings are Go-quoted. +result grants the message a result
// charge (result.go) of a rule "r" counting rows to rows and bytes to
// bytes; a server DataRow is counted as 10 bytes. A client Query with the
// word byconn after its text is decided by its connection alone.
//
// go test ./pgwire -run TestMachineTraces -rewrite regenerates the
// expected output.
var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/machine traces")

func TestMachineTraces(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "machine", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no traces in testdata/machine")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runTraceFile(t, f) })
	}
}

// traceBlock is one directive of a trace file, with its place in the file.
type traceBlock struct {
	line      int
	directive string
	input     []string
	want      []string
	prefix    []string // the comments and blank lines before it
}

func parseTraceFile(t *testing.T, path string) ([]traceBlock, []string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []traceBlock
	var prefix []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			prefix = append(prefix, l)
			continue
		}
		b := traceBlock{line: n, directive: l, prefix: prefix}
		prefix = nil
		inWant := false
		for sc.Scan() {
			n++
			l := sc.Text()
			switch {
			case !inWant && l == "----":
				inWant = true
			case !inWant:
				b.input = append(b.input, l)
			case l == "":
				goto next
			default:
				b.want = append(b.want, l)
			}
		}
		if !inWant {
			t.Fatalf("%s:%d: no ---- after the directive", path, b.line)
		}
	next:
		blocks = append(blocks, b)
	}
	return blocks, prefix
}

func runTraceFile(t *testing.T, path string) {
	blocks, tail := parseTraceFile(t, path)
	var r traceRunner
	var out bytes.Buffer
	for _, b := range blocks {
		got := r.run(t, path, b)
		for _, l := range b.prefix {
			out.WriteString(l + "\n")
		}
		out.WriteString(b.directive + "\n")
		for _, l := range b.input {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
		out.WriteString("\n")
		if !*rewrite && !slices.Equal(got, b.want) {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, b.line, b.directive,
				strings.Join(got, "\n"), strings.Join(b.want, "\n"))
		}
	}
	for _, l := range tail {
		if l != "" {
			out.WriteString(l + "\n")
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, bytes.TrimRight(out.Bytes(), "\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			f.WriteString("\n")
			f.Close()
		}
	}
}

// traceRunner drives a machine as the shell does, with classification done
// here from the text alone (no rules: the statements are shown as asked).
type traceRunner struct {
	m *machine
}

func (r *traceRunner) run(t *testing.T, path string, b traceBlock) []string {
	fields := strings.Fields(b.directive)
	switch fields[0] {
	case "new":
		r.m = newTraceMachine(!slices.Contains(fields[1:], "passthrough"), slices.Contains(fields[1:], "tls"))
		if !slices.Contains(fields[1:], "login") {
			r.m.login.phase = phaseRelay
		}
		return nil
	case "state":
		return []string{r.state()}
	case "trace":
		if r.m == nil {
			r.m = newTraceMachine(true, false)
			r.m.login.phase = phaseRelay
		}
		var out []string
		for _, in := range b.input {
			out = append(out, in)
			acts, err := r.step(in)
			if err != nil {
				t.Fatalf("%s:%d: %q: %v", path, b.line, in, err)
			}
			for _, a := range acts {
				out = append(out, "  "+describeAction(a))
			}
		}
		return out
	}
	t.Fatalf("%s:%d: unknown directive %q", path, b.line, b.directive)
	return nil
}

func (r *traceRunner) step(line string) ([]action, error) {
	args, err := traceArgs(line)
	if err != nil {
		return nil, err
	}
	switch line {
	case "resumed":
		return r.m.resumed(false), nil
	case "dialed", "dialed tls":
		return r.m.dialed(line == "dialed tls"), nil
	}
	if len(args) < 2 {
		return nil, fmt.Errorf("want a side and a message")
	}
	switch args[0] {
	case "client":
		msg, err := r.clientMsg(args[1], args[2:])
		if err != nil {
			return nil, err
		}
		return r.m.client(msg), nil
	case "server":
		t, body, err := serverMsg(args[1], args[2:])
		if err != nil {
			return nil, err
		}
		if t == MsgDataRow {
			r.m.dataRow(10)
		}
		return r.m.server(t, body), nil
	case "admission":
		return r.admission(args[1:])
	case "backend":
		if args[1] == "gone" {
			return r.m.ended(), nil
		}
	case "gave":
		if args[1] == "up" {
			return r.m.resumed(true), nil
		}
	case "startup":
		code, payload, err := startupPacket(args[1], args[2:])
		if err != nil {
			return nil, err
		}
		return r.m.startup(code, payload), nil
	}
	return nil, fmt.Errorf("unknown input")
}

func (r *traceRunner) admission(args []string) ([]action, error) {
	switch {
	case args[0] == "granted":
		var v verdict
		for _, class := range args[1:] {
			switch class {
			case "+result":
				v.result = &resultCharge{rule: "r", res: &classify.Result{Rows: "rows", Bytes: "bytes"}}
			case "wrote":
				v.wrote = true
			case "noticed":
				v.noticed = true
			default:
				v.grants = append(v.grants, heldTicket{class: class, t: traceTicket{}, since: time.Time{}})
			}
		}
		return r.m.answered(v), nil
	case args[0] == "denied" && len(args) == 3:
		return r.m.answered(verdict{deny: errorResponse("ERROR", args[1], args[2])}), nil
	case args[0] == "classify":
		return r.m.classified(), nil
	}
	return nil, fmt.Errorf("unknown admission input")
}

// startupPacket builds a startup packet's code and payload.
func startupPacket(name string, args []string) (uint32, []byte, error) {
	switch name {
	case "SSLRequest":
		return CodeSSLRequest, nil, nil
	case "GSSENCRequest":
		return CodeGSSENCRequest, nil, nil
	case "CancelRequest":
		return CodeCancelRequest, []byte{0, 0, 0, 7, 0, 0, 0, 9}, nil
	case "StartupMessage", "StartupMessage3.2":
		code := ProtocolVersion3
		if name == "StartupMessage3.2" {
			code |= 2
		}
		var payload []byte
		for _, kv := range args {
			k, v, _ := strings.Cut(kv, "=")
			payload = append(append(append(append(payload, k...), 0), v...), 0)
		}
		return code, append(payload, 0), nil
	case "Code":
		n, err := strconv.ParseUint(args[0], 10, 32)
		return uint32(n), nil, err
	}
	return 0, nil, fmt.Errorf("unknown startup packet %q", name)
}

// newTraceMachine is a machine as the shell makes it, with classification
// from the text alone.
func newTraceMachine(governs, tlsOffered bool) *machine {
	var cl textClassifier
	if governs {
		cl = classifyWith{}
	}
	return newMachine(cl, tlsOffered)
}

type classifyWith struct{}

func (classifyWith) ClassifyBytes(sql []byte, s sqlclass.Settings) *sqlclass.Class {
	return sqlclass.ClassifyWith(string(sql), s)
}

type traceTicket struct{}

func (traceTicket) End(time.Duration, bool) {}

// traceArgs splits a line into words and Go-quoted strings.
func traceArgs(line string) ([]string, error) {
	var args []string
	for line = strings.TrimSpace(line); line != ""; line = strings.TrimSpace(line) {
		if line[0] == '"' {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				return nil, err
			}
			s, _ := strconv.Unquote(q)
			args = append(args, s)
			line = line[len(q):]
			continue
		}
		w, rest, _ := strings.Cut(line, " ")
		args = append(args, w)
		line = rest
	}
	return args, nil
}

// clientMsg builds what the shell feeds the machine for a client's message.
func (r *traceRunner) clientMsg(name string, args []string) (clientMsg, error) {
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	msg := clientMsg{}
	switch name {
	case "Query":
		msg.t, msg.text, msg.byConn = MsgQuery, []byte(arg(0)), arg(1) == "byconn"
	case "FunctionCall":
		msg.t = MsgFunctionCall
	case "Parse":
		msg.t, msg.name, msg.text = MsgParse, arg(0), []byte(arg(1))
	case "Bind":
		msg.t, msg.name, msg.stmt = MsgBind, arg(0), arg(1)
	case "Execute":
		msg.t, msg.name = MsgExecute, arg(0)
	case "Close":
		msg.t, msg.name = MsgClose, arg(1)
		if a := arg(0); a != "" {
			msg.kind = a[0]
		}
	default:
		t, ok := clientTypes[name]
		if !ok {
			return msg, fmt.Errorf("unknown client message %q", name)
		}
		msg.t = t
	}
	return msg, nil
}

var clientTypes = map[string]MsgType{
	"Sync": MsgSync, "Describe": MsgDescribe, "Flush": MsgFlush, "Terminate": MsgTerminate,
	"CopyData": MsgCopyData, "CopyDone": MsgCopyDone, "CopyFail": MsgCopyFail, "Password": MsgPassword,
}

var serverTypes = map[string]MsgType{
	"ParseComplete": MsgParseComplete, "CloseComplete": MsgCloseComplete, "BindComplete": '2',
	"RowDescription": 'T', "DataRow": 'D', "NoData": 'n', "EmptyQueryResponse": 'I',
	"CopyInResponse": MsgCopyInResponse, "CopyOutResponse": MsgCopyOutResponse, "CopyData": MsgCopyData,
	"CopyDone": MsgCopyDone, "NoticeResponse": MsgNoticeResponse, "NotificationResponse": MsgNotification,
	"FunctionCallResponse": MsgFunctionCallResult, "ParameterDescription": MsgParameterDescriptor,
	"NegotiateProtocolVersion": MsgNegotiateProtocol,
}

// serverMsg builds a server's message: its type and the body the machine
// reads.
func serverMsg(name string, args []string) (MsgType, []byte, error) {
	switch name {
	case "ReadyForQuery":
		if len(args) != 1 || len(args[0]) != 1 {
			return 0, nil, fmt.Errorf("ReadyForQuery wants a status")
		}
		return MsgReadyForQuery, []byte(args[0]), nil
	case "ErrorResponse":
		if len(args) < 2 {
			return 0, nil, fmt.Errorf("ErrorResponse wants a SQLSTATE and a message")
		}
		sev := "ERROR"
		if len(args) > 2 {
			sev = args[2]
		}
		return MsgErrorResponse, errorResponse(sev, args[0], args[1])[headerLen:], nil
	case "CommandComplete":
		return MsgCommandComplete, append([]byte(strings.Join(args, " ")), 0), nil
	case "ParameterStatus":
		if len(args) != 2 {
			return 0, nil, fmt.Errorf("ParameterStatus wants a name and a value")
		}
		return MsgParameterStatus, []byte(args[0] + "\x00" + args[1] + "\x00"), nil
	case "Authentication":
		return authMsg(args)
	case "BackendKeyData":
		if len(args) != 2 {
			return 0, nil, fmt.Errorf("BackendKeyData wants a pid and a key")
		}
		pid, err := strconv.ParseUint(args[0], 10, 32)
		if err != nil {
			return 0, nil, err
		}
		return MsgBackendKeyData, append(binary.BigEndian.AppendUint32(nil, uint32(pid)), args[1]...), nil
	case "Raw":
		if len(args) != 2 || len(args[0]) != 1 {
			return 0, nil, fmt.Errorf("Raw wants a type and a body")
		}
		return MsgType(args[0][0]), []byte(args[1]), nil
	}
	t, ok := serverTypes[name]
	if !ok {
		return 0, nil, fmt.Errorf("unknown server message %q", name)
	}
	return t, nil, nil
}

// authMsg builds an Authentication request: its code, and for SASL the
// mechanisms.
func authMsg(args []string) (MsgType, []byte, error) {
	if len(args) < 1 {
		return 0, nil, fmt.Errorf("Authentication wants a code")
	}
	code, err := strconv.ParseUint(args[0], 10, 32)
	if err != nil {
		return 0, nil, err
	}
	body := binary.BigEndian.AppendUint32(nil, uint32(code))
	if code == authSASL {
		for _, mech := range args[1:] {
			body = append(append(body, mech...), 0)
		}
		body = append(body, 0)
	}
	return MsgAuthentication, body, nil
}

func describeAction(a action) string {
	switch a.kind {
	case actAwait:
		return "await the server's answers"
	case actWake:
		return "wake the client's side"
	case actTLS:
		return fmt.Sprintf("to client: %q, then TLS", a.data)
	case actCancel:
		return fmt.Sprintf("serve cancel request %x", a.data)
	case actDial:
		var kv []string
		for k, v := range a.params {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		return "dial the server for " + strings.Join(kv, " ")
	case actReadAuth:
		return "read the client's answer"
	case actRegister:
		return fmt.Sprintf("register a key for pid %d (server's key %q)", binary.BigEndian.Uint32(a.data), a.data[4:])
	case actLoggedIn:
		return "logged in: relay"
	case actFail:
		s := fmt.Sprintf("fail (%s): %v", a.failure, a.err)
		if len(a.data) > 0 {
			s += "; to client: " + describeMsgs(a.data, true)
		}
		return s
	case actForward:
		return "forward"
	case actDrop:
		return "drop"
	case actServer:
		return "to server: " + describeMsgs(a.data, false)
	case actClient:
		return "to client: " + describeMsgs(a.data, true)
	case actAsk:
		s := "ask admission: " + describeRun(a.ask)
		if a.ask.cl == byConnection {
			s = "ask admission: by connection"
			if a.ask.classified {
				s += ", runs " + describeRun(a.ask)
			}
		}
		if !a.ask.noticeDue {
			s += " (NOTICE given)"
		}
		return s
	case actSettle:
		var rs []string
		for _, rc := range a.results {
			rs = append(rs, fmt.Sprintf("%s rows=%d bytes=%d", rc.rule, rc.rows, rc.bytes))
		}
		return "settle results: " + strings.Join(rs, ", ")
	case actEnd:
		var classes []string
		for _, h := range a.end {
			classes = append(classes, h.class)
		}
		s := "end leases " + strings.Join(classes, " ")
		if a.overloaded {
			s += " (overloaded)"
		}
		return s
	}
	return fmt.Sprintf("action %d", a.kind)
}

func describeRun(q admitReq) string {
	var parts []string
	for _, s := range q.run {
		p := strings.Join(s.Kinds, "+")
		if p == "" {
			p = "?"
		}
		if len(s.Tables) > 0 {
			p += " " + strings.Join(s.Tables, ",")
		}
		if s.Count > 1 {
			p += fmt.Sprintf(" x%d", s.Count)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// describeMsgs renders the messages the machine injects.
func describeMsgs(b []byte, backend bool) string {
	var parts []string
	if len(b) == 1 {
		return fmt.Sprintf("%q", b)
	}
	if !backend && len(b) >= 8 && b[0] == 0 {
		var sm pgproto3.StartupMessage
		sm.Decode(b[4:])
		var kv []string
		for k, v := range sm.Parameters {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		return fmt.Sprintf("StartupMessage %d.%d %s", sm.ProtocolVersion>>16, sm.ProtocolVersion&0xffff, strings.Join(kv, " "))
	}
	for len(b) >= headerLen {
		t := MsgType(b[0])
		n := int(binary.BigEndian.Uint32(b[1:]))
		body := b[headerLen : 1+n]
		b = b[1+n:]
		switch {
		case backend && t == MsgErrorResponse:
			var e pgproto3.ErrorResponse
			e.Decode(body)
			parts = append(parts, fmt.Sprintf("ErrorResponse %s %s %q", e.Severity, e.Code, e.Message))
		case backend && t == MsgReadyForQuery:
			parts = append(parts, "ReadyForQuery "+string(body))
		case backend && t == MsgAuthentication:
			parts = append(parts, describeAuth(body))
		case backend && t == MsgNegotiateProtocol:
			parts = append(parts, fmt.Sprintf("NegotiateProtocolVersion 3.%d", binary.BigEndian.Uint32(body)))
		case !backend && t == MsgQuery:
			parts = append(parts, fmt.Sprintf("Query %q", strings.TrimRight(string(body), "\x00")))
		case !backend && t == MsgParse:
			var p pgproto3.Parse
			p.Decode(body)
			parts = append(parts, fmt.Sprintf("Parse %q %q", p.Name, p.Query))
		default:
			parts = append(parts, fmt.Sprintf("%q (%d bytes)", byte(t), len(body)))
		}
	}
	return strings.Join(parts, "; ")
}

func describeAuth(body []byte) string {
	var m pgproto3.AuthenticationSASL
	if err := m.Decode(body); err == nil {
		return "AuthenticationSASL " + strings.Join(m.AuthMechanisms, " ")
	}
	return fmt.Sprintf("Authentication %d", binary.BigEndian.Uint32(body))
}

// state renders the machine's state in one line.
func (r *traceRunner) state() string {
	m := r.m
	var owed []string
	for _, p := range m.queue {
		if p.deny != nil {
			owed = append(owed, "denial")
		} else {
			owed = append(owed, "answer")
		}
	}
	var leases []string
	for _, h := range m.tickets {
		leases = append(leases, h.class)
	}
	s := fmt.Sprintf("status %c; owed [%s]; leases [%s]", m.status, strings.Join(owed, " "), strings.Join(leases, " "))
	if m.login.phase != phaseRelay {
		s = fmt.Sprintf("login phase %d; ", m.login.phase) + s
	}
	if m.inBatch {
		s += "; in batch"
	}
	if m.discarding {
		s += "; discarding to Sync"
	}
	if m.asking {
		s += "; asking"
	}
	if m.waiting {
		s += "; waiting for the server"
	}
	if m.saidFatal {
		s += "; the server said FATAL"
	}
	s += "; statements [" + describeNames(m.names.stmts) + "]"
	s += "; portals [" + describeNames(m.names.portals) + "]"
	if len(m.names.undo) > 0 {
		s += fmt.Sprintf("; unconfirmed %d", len(m.names.undo))
	}
	if m.lex.BackslashEscapes {
		s += "; backslash escapes"
	}
	return s
}

func describeNames(names map[string]*sqlclass.Class) string {
	var out []string
	for name, cl := range names {
		out = append(out, fmt.Sprintf("%q=%s", name, describeRun(admitReq{run: cl.Statements})))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// queryCycle is a Query's trip through the machine: asked about (by its
// text, classified through the statement cache, or decided by the
// connection), granted, answered.
func queryCycle(m *machine, msg clientMsg, grants []heldTicket) {
	cc, rfq := []byte("SELECT 1\x00"), []byte{TxIdle}
	if acts := m.client(msg); acts[0].kind == actAsk {
		m.answered(verdict{grants: grants})
	}
	m.server(MsgCommandComplete, cc)
	m.server(MsgReadyForQuery, rfq)
}

// loggedInMachine is a machine past login, classifying through a
// statement cache as the shell's does (nil: governing nothing).
func loggedInMachine(cache *sqlclass.Cache) *machine {
	var cl textClassifier
	if cache != nil {
		cl = cache
	}
	m := newMachine(cl, false)
	m.login.phase = phaseRelay
	return m
}

// The machine is on every statement's path: it allocates nothing there
// but, when governed, the transaction's leases, which it hands to the
// shell when they end.
func TestMachineQueryAllocs(t *testing.T) {
	grants := []heldTicket{{class: "db", t: traceTicket{}}}
	text := []byte("SELECT 1")
	for _, tc := range []struct {
		name  string
		cache *sqlclass.Cache
		msg   clientMsg
		max   float64
	}{
		{"passthrough", nil, clientMsg{t: MsgQuery, text: text}, 0},
		{"governed", sqlclass.NewCache(16), clientMsg{t: MsgQuery, text: text}, 1},
		{"by connection", sqlclass.NewCache(16), clientMsg{t: MsgQuery, text: text, byConn: true}, 1},
	} {
		m := loggedInMachine(tc.cache)
		queryCycle(m, tc.msg, grants) // the buffers' first growth, the cache's entry
		if n := testing.AllocsPerRun(200, func() { queryCycle(m, tc.msg, grants) }); n > tc.max {
			t.Errorf("%s: %v allocations a Query, want at most %v", tc.name, n, tc.max)
		}
	}
}

func BenchmarkMachineQuery(b *testing.B) {
	m := loggedInMachine(sqlclass.NewCache(16))
	msg := clientMsg{t: MsgQuery, text: []byte("SELECT 1")}
	grants := []heldTicket{{class: "db", t: traceTicket{}}}
	b.ReportAllocs()
	for b.Loop() {
		queryCycle(m, msg, grants)
	}
}
