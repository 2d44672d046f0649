package pgwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MsgType is the one-byte type that starts every message after startup.
// Client and server reuse some letters for different messages ('C' is Close
// from a client and CommandComplete from a server), so the constants below
// are grouped by direction.
type MsgType byte

// Messages a client sends.
const (
	MsgBind         MsgType = 'B'
	MsgClose        MsgType = 'C'
	MsgCopyData     MsgType = 'd'
	MsgCopyDone     MsgType = 'c'
	MsgCopyFail     MsgType = 'f'
	MsgDescribe     MsgType = 'D'
	MsgExecute      MsgType = 'E'
	MsgFlush        MsgType = 'H'
	MsgFunctionCall MsgType = 'F'
	MsgParse        MsgType = 'P'
	MsgPassword     MsgType = 'p' // also SASLInitialResponse, SASLResponse, GSSResponse
	MsgQuery        MsgType = 'Q'
	MsgSync         MsgType = 'S'
	MsgTerminate    MsgType = 'X'
)

// Messages a server sends.
const (
	MsgAuthentication      MsgType = 'R'
	MsgBackendKeyData      MsgType = 'K'
	MsgCommandComplete     MsgType = 'C'
	MsgCopyInResponse      MsgType = 'G'
	MsgCopyOutResponse     MsgType = 'H'
	MsgCopyBothResponse    MsgType = 'W'
	MsgErrorResponse       MsgType = 'E'
	MsgNegotiateProtocol   MsgType = 'v'
	MsgNoticeResponse      MsgType = 'N'
	MsgNotification        MsgType = 'A'
	MsgParameterStatus     MsgType = 'S'
	MsgReadyForQuery       MsgType = 'Z'
	MsgFunctionCallResult  MsgType = 'V'
	MsgParameterDescriptor MsgType = 't'
	MsgParseComplete       MsgType = '1'
	MsgCloseComplete       MsgType = '3'
	MsgDataRow             MsgType = 'D'
)

// Codes in the first four bytes of a startup-phase packet, after its length.
const (
	ProtocolVersion3   uint32 = 3 << 16 // 196608: a StartupMessage for protocol 3.0
	CodeCancelRequest  uint32 = 80877102
	CodeSSLRequest     uint32 = 80877103
	CodeGSSENCRequest  uint32 = 80877104
	protocolMajorShift        = 16
)

// Answers to SSLRequest and GSSENCRequest.
const (
	answerYes byte = 'S'
	answerNo  byte = 'N'
)

// Authentication request codes (the Int32 after 'R').
const (
	authOK                = 0
	authCleartextPassword = 3
	authMD5Password       = 5
	authGSS               = 7
	authGSSContinue       = 8
	authSSPI              = 9
	authSASL              = 10
	authSASLContinue      = 11
	authSASLFinal         = 12
)

// Transaction status in ReadyForQuery.
const (
	TxIdle   byte = 'I'
	TxInTx   byte = 'T'
	TxFailed byte = 'E'
)

// Size limits, enforced while reading, before any buffer is allocated.
const (
	// MaxStartupPacketSize is PostgreSQL's own cap on a startup packet
	// (MAX_STARTUP_PACKET_LENGTH).
	MaxStartupPacketSize = 10000
	// DefaultMaxMessageSize caps a message after startup unless
	// Proxy.MaxMessageSize says otherwise. Messages the proxy only relays
	// (CopyData, DataRow) are streamed, never held whole; the cap still
	// applies so a peer cannot announce an absurd length.
	DefaultMaxMessageSize = 256 << 20
	// MaxAuthMessageSize caps the body of a client's answer to an
	// authentication request (PasswordMessage, SASLInitialResponse,
	// SASLResponse, GSSResponse), read before login: PostgreSQL's own cap,
	// PG_MAX_AUTH_TOKEN_LENGTH, 65,535 bytes with the length word. The
	// server holds some to less (1,024 bytes for SCRAM's messages).
	MaxAuthMessageSize = 65535 - 4
	// keepBuffer is the largest message buffer a connection keeps from one
	// message to the next; one grown past it for a large message is let go
	// after that message, so that an idle connection holds little.
	keepBuffer = 64 << 10

	headerLen = 5 // type byte + Int32 length
)

// Errors from reading the wire. Each is wrapped with the direction and the
// message type; use errors.Is.
var (
	// ErrMessageTooLarge: a message's announced length is over the cap.
	ErrMessageTooLarge = errors.New("message too large")
	// ErrBadLength: a message's announced length is below its own header.
	ErrBadLength = errors.New("invalid message length")
)

// readStartup reads one startup-phase packet (StartupMessage, SSLRequest,
// GSSENCRequest or CancelRequest): Int32 length (itself included), Int32
// code, payload. It returns the code and the payload after the code.
func readStartup(r io.Reader) (code uint32, payload []byte, err error) {
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 8 {
		return 0, nil, fmt.Errorf("startup packet of %d bytes: %w", n, ErrBadLength)
	}
	if n > MaxStartupPacketSize {
		return 0, nil, fmt.Errorf("startup packet of %d bytes (cap %d): %w", n, MaxStartupPacketSize, ErrMessageTooLarge)
	}
	code = binary.BigEndian.Uint32(hdr[4:])
	payload = make([]byte, n-8)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("startup packet: %w", noEOF(err))
	}
	return code, payload, nil
}

// readHeader reads a message header and returns its type and the length of
// its body (the announced length minus its own four bytes), checked against
// max.
func readHeader(r io.Reader, hdr *[headerLen]byte, max int) (MsgType, int, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, err
	}
	t := MsgType(hdr[0])
	n := int64(binary.BigEndian.Uint32(hdr[1:]))
	if n < 4 {
		return t, 0, fmt.Errorf("message %q: length %d: %w", byte(t), n, ErrBadLength)
	}
	if n-4 > int64(max) {
		return t, 0, fmt.Errorf("message %q: %d bytes (cap %d): %w", byte(t), n-4, max, ErrMessageTooLarge)
	}
	return t, int(n - 4), nil
}

// readBody reads a body of n bytes into buf, growing it as needed.
func readBody(r io.Reader, buf []byte, n int) ([]byte, error) {
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return buf, noEOF(err)
	}
	return buf, nil
}

// shrink returns b to be reused for the next message, or nil when it is
// over keepBuffer.
func shrink(b []byte) []byte {
	if cap(b) > keepBuffer {
		return nil
	}
	return b
}

// fatal reports whether an ErrorResponse body has severity FATAL or PANIC:
// the server's last word before it closes.
func fatal(body []byte) bool {
	var severity string
	for len(body) > 0 && body[0] != 0 {
		f := body[0]
		v, rest, ok := cstring(body[1:])
		if !ok {
			break
		}
		switch {
		case f == 'V': // never localized (PostgreSQL 9.6 and later)
			return v == "FATAL" || v == "PANIC"
		case f == 'S':
			severity = v
		}
		body = rest
	}
	return severity == "FATAL" || severity == "PANIC"
}

// noEOF turns an EOF in the middle of a message into ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendMsg appends a message of type t with the given body.
func appendMsg(dst []byte, t MsgType, body ...[]byte) []byte {
	n := 4
	for _, b := range body {
		n += len(b)
	}
	dst = append(dst, byte(t))
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	for _, b := range body {
		dst = append(dst, b...)
	}
	return dst
}

// cstring returns the NUL-terminated string at the start of b and the rest.
func cstring(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return "", nil, false
}

// errorFields returns the SQLSTATE (field 'C') and message (field 'M') of an
// ErrorResponse or NoticeResponse body, without decoding the rest.
func errorFields(body []byte) (code, msg string) {
	for len(body) > 0 && body[0] != 0 {
		f := body[0]
		v, rest, ok := cstring(body[1:])
		if !ok {
			return code, msg
		}
		switch f {
		case 'C':
			code = v
		case 'M':
			msg = v
		}
		body = rest
	}
	return code, msg
}
