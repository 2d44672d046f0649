package pgwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
)

// The machine's first two phases: the client's startup packets, then the
// login relayed between the client and the server, up to the first
// ReadyForQuery. The shell reads each packet or message (under the caps
// of wire.go), carries out the TLS handshakes, the dial and the cancel
// the machine asks for, and writes what it says.

// loginPhase is where a connection is in its life.
type loginPhase uint8

const (
	phaseStartup loginPhase = iota // the client's startup packets (startup)
	phaseAuth                      // the login, relayed (loginServer, loginClient)
	phaseRelay                     // logged in: the relay (client, server)
)

// loginState is what the machine keeps of the startup and the login.
type loginState struct {
	phase      loginPhase
	tlsOffered bool // an SSLRequest may be answered with TLS
	tlsDone    bool // and was
	upTLS      bool // the server's leg is TLS: SCRAM-SHA-256-PLUS is hidden
	params     map[string]string
	minor      uint16 // the client's protocol minor version
	authCode   uint32 // the authentication request the client answers
}

// errLoginRefused: the server ended the login with an ErrorResponse.
var errLoginRefused = errors.New("server refused the login")

// startup takes a client's startup packet (its code and what follows it)
// before login: SSLRequest is answered 'N', or 'S' and TLS (actTLS), once;
// GSSENCRequest 'N'; a CancelRequest is served (actCancel) and ends the
// connection; a StartupMessage of protocol 3.x asks for the server
// (actDial, with its parameters), and anything else is refused (actFail).
func (m *machine) startup(code uint32, payload []byte) []action {
	m.cacts = m.cacts[:0]
	l := &m.login
	switch {
	case code == CodeSSLRequest && len(payload) == 0 && !l.tlsDone:
		if !l.tlsOffered {
			return m.cact(action{kind: actClient, data: []byte{answerNo}})
		}
		l.tlsDone = true
		return m.cact(action{kind: actTLS, data: []byte{answerYes}})
	case code == CodeGSSENCRequest && len(payload) == 0:
		return m.cact(action{kind: actClient, data: []byte{answerNo}})
	case code == CodeCancelRequest:
		return m.cact(action{kind: actCancel, data: payload})
	case code>>protocolMajorShift == 3:
		params, err := parseParams(payload)
		if err != nil {
			return m.failStartup(err, "08P01", "invalid startup packet: "+err.Error())
		}
		if params["user"] == "" {
			return m.failStartup(errors.New("no user in the startup packet"), "28000", "no PostgreSQL user name specified in startup packet")
		}
		l.params, l.minor = params, uint16(code)
		return m.cact(action{kind: actDial, params: params})
	}
	return m.failStartup(fmt.Errorf("unsupported startup code %d", code), "0A000",
		fmt.Sprintf("unsupported frontend protocol %d.%d", code>>16, code&0xffff))
}

func (m *machine) failStartup(err error, code, msg string) []action {
	return m.cact(action{kind: actFail, failure: FailStartup, err: err, data: errorResponse("FATAL", code, msg)})
}

// dialed takes the server's connection, made after actDial: the startup
// goes to it, forced to protocol 3.0, and a client that asked for a later
// minor version is told so, as a server would.
func (m *machine) dialed(upTLS bool) []action {
	m.cacts = m.cacts[:0]
	l := &m.login
	l.upTLS, l.phase = upTLS, phaseAuth
	if l.minor != 0 {
		b, _ := (&pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: 0}).Encode(nil)
		m.cact(action{kind: actClient, data: b})
	}
	b, err := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: l.params}).Encode(nil)
	if err != nil {
		return m.cact(action{kind: actFail, failure: FailUpstream, err: err})
	}
	return m.cact(action{kind: actServer, data: b})
}

// loginServer takes a server's message during the login: Authentication
// requests pass to the client (SCRAM-SHA-256-PLUS hidden when the
// server's leg is TLS), and those the client answers are read from it
// (actReadAuth); BackendKeyData is replaced by a key of the proxy's
// (actRegister); an ErrorResponse ends the login; ReadyForQuery ends it
// logged in (actLoggedIn), and the relay starts.
func (m *machine) loginServer(t MsgType, body []byte) []action {
	switch t {
	case MsgAuthentication:
		return m.authRequest(body)
	case MsgBackendKeyData:
		if len(body) < 8 {
			return m.failLogin(fmt.Errorf("BackendKeyData of %d bytes: %w", len(body), errProtocol))
		}
		// A copy: the machine keeps no server's buffer past its call.
		return m.sact(action{kind: actRegister, data: bytes.Clone(body)})
	case MsgErrorResponse:
		code, msg := errorFields(body)
		m.sact(action{kind: actForward})
		return m.failLogin(fmt.Errorf("%w: %s %s", errLoginRefused, code, msg))
	case MsgReadyForQuery:
		if len(body) != 1 {
			return m.failLogin(fmt.Errorf("ReadyForQuery of %d bytes: %w", len(body), errProtocol))
		}
		m.status, m.login.phase, m.login.params = body[0], phaseRelay, nil
		m.sact(action{kind: actLoggedIn})
	case MsgParameterStatus:
		m.noteParameter(body)
	}
	return m.sact(action{kind: actForward})
}

// authRequest takes an Authentication request.
func (m *machine) authRequest(body []byte) []action {
	if len(body) < 4 {
		return m.failLogin(fmt.Errorf("authentication message of %d bytes: %w", len(body), errProtocol))
	}
	code := binary.BigEndian.Uint32(body)
	if code == authSASL && m.login.upTLS {
		m.sact(action{kind: actClient, data: appendMsg(nil, MsgAuthentication, stripChannelBinding(body))})
	} else {
		m.sact(action{kind: actForward})
	}
	switch code {
	case authCleartextPassword, authMD5Password, authSASL, authSASLContinue, authGSS, authGSSContinue, authSSPI:
		m.login.authCode = code
		m.sact(action{kind: actReadAuth})
	}
	return m.sacts
}

// loginClient takes the client's answer to an authentication request,
// read after actReadAuth.
func (m *machine) loginClient(msg clientMsg) []action {
	if m.login.phase != phaseAuth || msg.t != MsgPassword {
		return m.cact(action{kind: actFail, failure: FailAuth,
			err: fmt.Errorf("client answered authentication %d with %q: %w", m.login.authCode, byte(msg.t), errProtocol)})
	}
	return m.cact(action{kind: actForward})
}

func (m *machine) failLogin(err error) []action {
	return m.sact(action{kind: actFail, failure: FailAuth, err: err})
}

func parseParams(b []byte) (map[string]string, error) {
	m := make(map[string]string)
	for len(b) > 0 && b[0] != 0 {
		k, rest, ok := cstring(b)
		if !ok {
			return nil, errors.New("unterminated parameter name")
		}
		v, rest, ok := cstring(rest)
		if !ok {
			return nil, fmt.Errorf("unterminated value of %q", k)
		}
		m[k] = v
		b = rest
	}
	if len(b) == 0 {
		return nil, errors.New("missing terminator")
	}
	return m, nil
}

// stripChannelBinding removes SCRAM-SHA-256-PLUS from an AuthenticationSASL
// body. Channel binding binds the SCRAM exchange to the server's TLS
// certificate, which the client never sees through the proxy, so a client
// that chose -PLUS would fail; offered only SCRAM-SHA-256 it does not.
func stripChannelBinding(body []byte) []byte {
	var m pgproto3.AuthenticationSASL
	if err := m.Decode(body); err != nil {
		return body
	}
	kept := m.AuthMechanisms[:0]
	for _, mech := range m.AuthMechanisms {
		if mech != "SCRAM-SHA-256-PLUS" {
			kept = append(kept, mech)
		}
	}
	m.AuthMechanisms = kept
	b, err := m.Encode(nil)
	if err != nil {
		return body
	}
	return b[headerLen:]
}
