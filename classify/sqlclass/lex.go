package sqlclass

import "strings"

// Settings are the server settings that change where SQL text's strings,
// quoted identifiers and statements begin and end. The server reports both
// in ParameterStatus, at login and whenever they change; text lexed with the
// wrong ones can hide a statement inside what looks like a string.
type Settings struct {
	// BackslashEscapes is standard_conforming_strings = off: a backslash
	// escapes the next character in '...' and N'...' strings too, not only in
	// E'...'.
	BackslashEscapes bool
	// Encoding is the client_encoding's character layout (EncodingOf).
	Encoding Encoding
}

// Encoding is how a client encoding splits bytes into characters, as far as
// lexing cares: in a few client-only encodings the second byte of a
// character may be an ASCII byte such as a backslash, which must not be
// taken for one.
type Encoding uint8

// The encodings told apart. Every encoding whose multibyte characters are
// all bytes >= 0x80 (UTF8, the EUC family, the LATIN and WIN code pages,
// SQL_ASCII, ...) lexes as ASCIISafe.
const (
	ASCIISafe Encoding = iota
	EncodingSJIS
	EncodingDoubleByte // BIG5, GBK, UHC: every byte >= 0x80 starts a 2-byte character
	EncodingGB18030
	EncodingJOHAB
)

// EncodingOf maps a client_encoding name, as the server reports it, to its
// layout.
func EncodingOf(name string) Encoding {
	switch strings.ToUpper(strings.NewReplacer("_", "", "-", "").Replace(name)) {
	case "SJIS", "SHIFTJIS", "SHIFTJIS2004", "MSKANJI", "WIN932", "WINDOWS932":
		return EncodingSJIS
	case "BIG5", "WIN950", "WINDOWS950", "GBK", "WIN936", "WINDOWS936", "UHC", "WIN949", "WINDOWS949":
		return EncodingDoubleByte
	case "GB18030":
		return EncodingGB18030
	case "JOHAB":
		return EncodingJOHAB
	}
	return ASCIISafe
}

// charLen is the length of the character that starts with the byte at i,
// as PostgreSQL's pg_*_mblen functions measure it.
func (e Encoding) charLen(s string, i int) int { return charLen(e, s, i) }

func charLen[T string | []byte](e Encoding, s T, i int) int {
	c := s[i]
	if c < 0x80 {
		return 1
	}
	n := 1
	switch e {
	case EncodingSJIS:
		if c < 0xa1 || c > 0xdf { // 0xa1-0xdf: half-width katakana, one byte
			n = 2
		}
	case EncodingDoubleByte:
		n = 2
	case EncodingGB18030:
		n = 2
		if i+1 < len(s) && s[i+1] >= 0x30 && s[i+1] <= 0x39 {
			n = 4
		}
	case EncodingJOHAB:
		switch c {
		case 0x8e:
			n = 2
		case 0x8f:
			n = 3
		default:
			n = 2
		}
	}
	return min(n, len(s)-i)
}

// tokKind is what the lexer tells apart: only as much as classification
// needs. The text of strings, numbers and operators is never looked at.
type tokKind uint8

const (
	tokEOF    tokKind = iota
	tokIdent          // unquoted identifier or keyword
	tokQIdent         // "quoted" identifier
	tokUIdent         // U&"quoted" identifier, with Unicode escapes
	tokString         // any string literal or dollar-quoted body
	tokNumber
	tokParam // $1
	tokOp    // a run of operator characters
	tokLParen
	tokRParen
	tokComma
	tokDot
	tokSemi
)

// token is one token: its kind and, for identifiers, where its text is in
// the source (for a quoted identifier, between the quotes). Tokens are made
// one at a time and never stored in bulk, so a text's tokens cost no memory.
type token struct {
	kind       tokKind
	kw         keyword // for tokIdent: the keyword it is, if it is one this package knows
	start, end int
}

func (t token) is(k keyword) bool { return t.kind == tokIdent && t.kw == k }

// isIdent reports an identifier, quoted or not.
func (t token) isIdent() bool {
	return t.kind == tokIdent || t.kind == tokQIdent || t.kind == tokUIdent
}

// isName reports an identifier that may name a table or a function: quoted,
// or unquoted and not a reserved word.
func (t token) isName() bool {
	return t.kind == tokQIdent || t.kind == tokUIdent || (t.kind == tokIdent && !t.kw.reserved())
}

// lexer splits text into tokens on demand. It never fails: an unterminated
// string, quoted identifier or comment runs to the end of the text, as the
// server would refuse the text anyway. It runs in one pass and keeps
// nothing, so a text of any size lexes in linear time and constant memory.
type lexer struct {
	src string
	pos int
	set Settings
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// lineEnd returns where the -- comment at i ends: at the next line feed or
// carriage return, either of which ends a line for the server, or at the
// end of the text.
func lineEnd(s string, i int) int {
	if j := strings.IndexAny(s[i:], "\n\r"); j >= 0 {
		return i + j
	}
	return len(s)
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentCont(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

// isOpChar: bytes that form operators and other punctuation. A run of them
// is one token, so that punctuation costs no more than letters.
func isOpChar(c byte) bool {
	switch c {
	case '(', ')', ',', '.', ';', '\'', '"', '$':
		return false
	}
	return !isSpace(c) && !isIdentCont(c)
}

// next returns the next token, or tokEOF at the end of the text. As the
// server's grammar does (parser.c's filter between lexer and grammar), it
// takes an UESCAPE clause after a U& literal as part of the literal.
func (l *lexer) next() token {
	t := l.scan()
	if t.kind == tokUIdent || (t.kind == tokString && (l.src[t.start] == 'u' || l.src[t.start] == 'U')) {
		l.uescape()
	}
	return t
}

// skipSpace skips white space and comments from i.
func (l *lexer) skipSpace(i int) int {
	s, n := l.src, len(l.src)
	for i < n {
		c := s[i]
		switch {
		case isSpace(c):
			i++
		case c == '-' && i+1 < n && s[i+1] == '-':
			i = lineEnd(s, i)
		case c == '/' && i+1 < n && s[i+1] == '*':
			i = l.skipBlockComment(i)
		default:
			return i
		}
	}
	return i
}

// scanDollar reads what starts with the '$' at i: a parameter ($1), a
// dollar-quoted string, or else the '$' alone as an operator.
func (l *lexer) scanDollar(i int) (tokKind, int) {
	s, n := l.src, len(l.src)
	if i+1 < n && isDigit(s[i+1]) {
		i += 2
		for i < n && isDigit(s[i]) {
			i++
		}
		return tokParam, i
	}
	if end, ok := l.skipDollar(i); ok {
		return tokString, end
	}
	return tokOp, i + 1
}

// skipOperator skips an operator at i: a run of punctuation, cut where a
// comment starts.
func skipOperator(s string, i int) int {
	n := len(s)
	i++
	for i < n && isOpChar(s[i]) && !((s[i] == '-' && i+1 < n && s[i+1] == '-') || (s[i] == '/' && i+1 < n && s[i+1] == '*')) {
		i++
	}
	return i
}

// scan returns the next token as the server's lexer (scan.l) makes it.
func (l *lexer) scan() token {
	s, n := l.src, len(l.src)
	i := l.skipSpace(l.pos)
	if i >= n {
		l.pos = n
		return token{kind: tokEOF, start: n, end: n}
	}
	t := token{start: i}
	c := s[i]
	switch {
	case c == '\'':
		t.kind, i = tokString, l.skipString(i+1, l.plainQuoting())
	case c == '"':
		t.kind, t.start = tokQIdent, i+1
		t.end, i = l.skipQuotedIdent(t.start)
	case (c == 'e' || c == 'E') && i+1 < n && s[i+1] == '\'':
		t.kind, i = tokString, l.skipString(i+2, qEscape)
	case (c == 'n' || c == 'N') && i+1 < n && s[i+1] == '\'':
		// National character: an ordinary string after the N.
		t.kind, i = tokString, l.skipString(i+2, l.plainQuoting())
	case (c == 'b' || c == 'B' || c == 'x' || c == 'X') && i+1 < n && s[i+1] == '\'':
		t.kind, i = tokString, l.skipString(i+2, qBits)
	case (c == 'u' || c == 'U') && i+2 < n && s[i+1] == '&' && s[i+2] == '"':
		t.kind, t.start = tokUIdent, i+3
		t.end, i = l.skipQuotedIdent(t.start)
	case (c == 'u' || c == 'U') && i+2 < n && s[i+1] == '&' && s[i+2] == '\'':
		t.kind, i = tokString, l.skipString(i+3, qUnicode)
	case c == '$':
		t.kind, i = l.scanDollar(i)
	case isIdentStart(c):
		i = l.skipIdent(i)
		t.kind, t.end = tokIdent, i
		t.kw = lookupKeyword(s[t.start:i])
	case isDigit(c) || (c == '.' && i+1 < n && isDigit(s[i+1])):
		t.kind, i = tokNumber, skipNumber(s, i)
	case c == '(':
		t.kind, i = tokLParen, i+1
	case c == ')':
		t.kind, i = tokRParen, i+1
	case c == ',':
		t.kind, i = tokComma, i+1
	case c == '.':
		t.kind, i = tokDot, i+1
	case c == ';':
		t.kind, i = tokSemi, i+1
	default:
		t.kind, i = tokOp, skipOperator(s, i)
	}
	if !t.isIdent() {
		t.end = i
	}
	l.pos = i
	return t
}

// skipIdent returns the index after the unquoted identifier at i. In an
// encoding whose characters may hold ASCII bytes, a character is skipped
// whole.
func (l *lexer) skipIdent(i int) int {
	s := l.src
	for i < len(s) && isIdentCont(s[i]) {
		if s[i] >= 0x80 && l.set.Encoding != ASCIISafe {
			i += l.set.Encoding.charLen(s, i)
			continue
		}
		i++
	}
	return i
}

// skipNumber returns the index after the numeric literal at i: digits, an
// optional fraction and an optional exponent, as PostgreSQL lexes them. It
// stops before letters, so "1from" reads as 1 and from, as servers before
// 15 read it (later ones refuse it).
func skipNumber(s string, i int) int {
	n := len(s)
	for i < n && isDigit(s[i]) {
		i++
	}
	if i < n && s[i] == '.' && !(i+1 < n && s[i+1] == '.') {
		i++
		for i < n && isDigit(s[i]) {
			i++
		}
	}
	if i < n && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < n && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < n && isDigit(s[j]) {
			for i = j; i < n && isDigit(s[i]); i++ {
			}
		}
	}
	return i
}

// skipBlockComment returns the index after the /* ... */ comment at i.
// Block comments nest in PostgreSQL.
func (l *lexer) skipBlockComment(i int) int {
	s, depth := l.src, 0
	for i < len(s) {
		switch {
		case s[i] == '/' && i+1 < len(s) && s[i+1] == '*':
			depth++
			i += 2
		case s[i] == '*' && i+1 < len(s) && s[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return i
}

// DependsOnSettings reports whether the lexing of sql may depend on
// Settings: only a backslash, or a byte of a multibyte character, can be
// read differently.
func DependsOnSettings(sql []byte) bool {
	for _, c := range sql {
		if c == '\\' || c >= 0x80 {
			return true
		}
	}
	return false
}
