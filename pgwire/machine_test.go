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
//	new [passthrough]   a fresh machine, governed unless passthrough
//	trace               each input line, then its actions, indented
//	state               the machine's state
//
// Inputs: client <Message> [args], server <Message> [args],
// admission granted [class...] [+result], admission denied <SQLSTATE>
// "<message>", backend gone. Strings are Go-quoted. +result grants the
// message a result charge (result.go) of a rule "r" counting rows to rows
// and bytes to bytes; a server DataRow is counted as 10 bytes.
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
		r.m = newMachine(!slices.Contains(fields[1:], "passthrough"))
		return nil
	case "state":
		return []string{r.state()}
	case "trace":
		if r.m == nil {
			r.m = newMachine(true)
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
		switch {
		case args[1] == "granted":
			var grants []heldTicket
			for _, class := range args[2:] {
				if class == "+result" {
					r.m.nextResult = &resultCharge{rule: "r", res: &classify.Result{Rows: "rows", Bytes: "bytes"}}
					continue
				}
				grants = append(grants, heldTicket{class: class, t: traceTicket{}, since: time.Time{}})
			}
			return r.m.answered(nil, grants), nil
		case args[1] == "denied" && len(args) == 4:
			return r.m.answered(errorResponse("ERROR", args[2], args[3]), nil), nil
		}
	case "backend":
		if args[1] == "gone" {
			return r.m.ended(), nil
		}
	}
	return nil, fmt.Errorf("unknown input")
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
	m := r.m
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	msg := clientMsg{settled: true}
	switch name {
	case "Query":
		msg.t, msg.text = MsgQuery, []byte(arg(0))
		if m.governs {
			msg.cl = sqlclass.ClassifyWith(arg(0), m.lex)
			msg.run, msg.changes = m.running(msg.cl)
		}
	case "FunctionCall":
		msg.t = MsgFunctionCall
		if m.governs {
			msg.cl, msg.run = functionCallClass, functionCallClass.Statements
		}
	case "Parse":
		msg.t, msg.name = MsgParse, arg(0)
		if m.governs {
			msg.cl = sqlclass.ClassifyWith(arg(1), m.lex)
		}
	case "Bind":
		msg.t, msg.name, msg.stmt = MsgBind, arg(0), arg(1)
	case "Execute":
		msg.t, msg.name = MsgExecute, arg(0)
		if m.governs {
			msg.cl = m.portal(arg(0))
			msg.run, msg.changes = m.running(msg.cl)
		}
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
	"CopyData": MsgCopyData, "CopyDone": MsgCopyDone, "CopyFail": MsgCopyFail,
}

var serverTypes = map[string]MsgType{
	"ParseComplete": MsgParseComplete, "CloseComplete": MsgCloseComplete, "BindComplete": '2',
	"RowDescription": 'T', "DataRow": 'D', "NoData": 'n', "EmptyQueryResponse": 'I',
	"CopyInResponse": MsgCopyInResponse, "CopyOutResponse": MsgCopyOutResponse, "CopyData": MsgCopyData,
	"CopyDone": MsgCopyDone, "NoticeResponse": MsgNoticeResponse, "NotificationResponse": MsgNotification,
	"FunctionCallResponse": MsgFunctionCallResult, "ParameterDescription": MsgParameterDescriptor,
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
	}
	t, ok := serverTypes[name]
	if !ok {
		return 0, nil, fmt.Errorf("unknown server message %q", name)
	}
	return t, nil, nil
}

func describeAction(a action) string {
	switch a.kind {
	case actForward:
		return "forward"
	case actDrop:
		return "drop"
	case actServer:
		return "to server: " + describeMsgs(a.data, false)
	case actClient:
		return "to client: " + describeMsgs(a.data, true)
	case actAsk:
		return "ask admission: " + describeRun(a.ask)
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
	if m.inBatch {
		s += "; in batch"
	}
	if m.discarding {
		s += "; discarding to Sync"
	}
	if m.asking {
		s += "; asking"
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

// queryCycle is a governed Query's trip through the machine: asked
// about, granted, answered.
func queryCycle(m *machine, cl *sqlclass.Class, grants []heldTicket) {
	cc, rfq := []byte("SELECT 1\x00"), []byte{TxIdle}
	msg := clientMsg{t: MsgQuery}
	if cl != nil {
		msg.cl, msg.run = cl, cl.Statements
	}
	if acts := m.client(msg); acts[0].kind == actAsk {
		m.answered(nil, grants)
	}
	m.server(MsgCommandComplete, cc)
	m.server(MsgReadyForQuery, rfq)
}

// The machine is on every statement's path: it allocates nothing there
// but, when governed, the transaction's leases, which it hands to the
// shell when they end.
func TestMachineQueryAllocs(t *testing.T) {
	grants := []heldTicket{{class: "db", t: traceTicket{}}}
	for _, tc := range []struct {
		name    string
		governs bool
		max     float64
	}{{"passthrough", false, 0}, {"governed", true, 1}} {
		m := newMachine(tc.governs)
		var cl *sqlclass.Class
		if tc.governs {
			cl = sqlclass.ClassifyWith("SELECT 1", m.lex)
		}
		queryCycle(m, cl, grants) // the buffers' first growth
		if n := testing.AllocsPerRun(200, func() { queryCycle(m, cl, grants) }); n > tc.max {
			t.Errorf("%s: %v allocations a Query, want at most %v", tc.name, n, tc.max)
		}
	}
}

func BenchmarkMachineQuery(b *testing.B) {
	m := newMachine(true)
	cl := sqlclass.ClassifyWith("SELECT 1", m.lex)
	grants := []heldTicket{{class: "db", t: traceTicket{}}}
	b.ReportAllocs()
	for b.Loop() {
		queryCycle(m, cl, grants)
	}
}
