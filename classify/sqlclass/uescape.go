package sqlclass

import (
	"strings"
	"unicode/utf8"
)

// U&"..." identifiers and U&'...' strings write characters as escapes:
// \XXXX or \+XXXXXX (hex code points; a UTF-16 surrogate pair makes one),
// and \\ for a backslash. UESCAPE 'c' after the literal names another
// escape character. The server decodes them after lexing (parser.c's
// str_udeescape), so an identifier's name is its decoded text: U&"l\0065dger"
// is ledger. Its case is kept, as a quoted identifier's is.
//
// The server refuses a text in which any of this is wrong, and then nothing
// in it runs: an escape of neither form, a code point of 0 or past
// 10FFFF, an unpaired surrogate; an UESCAPE not followed by a simple string
// literal ('...', E'...' or a dollar quote) of exactly one byte that is not
// a hex digit, +, a quote or a space. Such a name cannot let a write
// through, so it is read for what its writer most likely meant: the escapes
// that decode are decoded and the others kept as written, with the one
// character UESCAPE gives (or \ when it gives not one). A server that reads
// the text after all (an older or newer one) then still meets the name the
// rules would see for it.

// escape is a U& identifier's escape character, its bytes packed low byte
// first: one character, of at most 4 bytes, none of them 0.
type escape uint32

const defaultEscape escape = '\\'

// packEscape packs b, one character in encoding enc, as an escape; false
// when b is not one character.
func packEscape(b []byte, enc Encoding) (escape, bool) {
	switch {
	case len(b) == 0 || len(b) > utf8.UTFMax:
		return 0, false
	case len(b) == 1:
	case enc != ASCIISafe:
		if charLen(enc, b, 0) != len(b) {
			return 0, false
		}
	default:
		if r, n := utf8.DecodeRune(b); r == utf8.RuneError || n != len(b) {
			return 0, false
		}
	}
	var e escape
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == 0 {
			return 0, false
		}
		e = e<<8 | escape(b[i])
	}
	return e, true
}

// len is the escape's length in bytes.
func (e escape) len() int {
	n := 0
	for ; e != 0; e >>= 8 {
		n++
	}
	return n
}

// at reports whether b holds the escape at i.
func (e escape) at(b []byte, i int) bool {
	for ; e != 0; e >>= 8 {
		if i >= len(b) || b[i] != byte(e) {
			return false
		}
		i++
	}
	return true
}

func (e escape) appendTo(dst []byte) []byte {
	for ; e != 0; e >>= 8 {
		dst = append(dst, byte(e))
	}
	return dst
}

// uescape reads the UESCAPE clause that may follow a U& literal (the
// lexer is just past it): UESCAPE and the string after it are part of the
// literal. It returns the escape the clause names for an identifier: the
// string's one character, or \ when there is no clause or not one
// character. A clause without a string is read as far as UESCAPE (the
// server refuses the text).
func (l *lexer) uescape() escape {
	at := l.pos
	if kw := l.scan(); !kw.is(kwUescape) {
		l.pos = at
		return defaultEscape
	}
	after := l.pos
	v := l.scan()
	if v.kind != tokString {
		l.pos = after
		return defaultEscape
	}
	var buf [utf8.UTFMax + 1]byte
	if e, ok := packEscape(l.literalValue(buf[:0], v), l.set.Encoding); ok {
		return e
	}
	return defaultEscape
}

// escapeOf returns the escape character of the U& identifier t, which the
// UESCAPE clause after it names. It is not kept in t: a token of one more
// field costs every token a third more time to pass around.
func (l *lexer) escapeOf(t token) escape {
	if t.end >= len(l.src) {
		return defaultEscape // not closed
	}
	after := lexer{src: l.src, pos: t.end + 1, set: l.set}
	return after.uescape()
}

// literalValue appends to dst, up to its capacity, the value of the string
// literal v: its bodies joined, a doubled quote read as one and, where
// backslashes escape, the escapes decoded. A U&'...' body is taken as
// written.
func (l *lexer) literalValue(dst []byte, v token) []byte {
	s, enc := l.src[:v.end], l.set.Encoding
	i := v.start
	if s[i] == '$' {
		open := i + strings.IndexByte(s[i+1:], '$') + 2 // after $tag$
		body := s[open:]
		if delim := s[i:open]; len(body) >= len(delim) && strings.HasSuffix(body, delim) {
			body = body[:len(body)-len(delim)]
		}
		return append(dst, body[:min(len(body), cap(dst)-len(dst))]...)
	}
	q := l.plainQuoting()
	switch s[i] {
	case 'e', 'E':
		q = qEscape
	case 'b', 'B', 'x', 'X':
		q = qBits
	case 'u', 'U':
		q = qUnicode
	}
	i += strings.IndexByte(s[i:], '\'') + 1
	for i < len(s) && len(dst) < cap(dst) {
		switch c := s[i]; {
		case c >= 0x80 && enc != ASCIISafe:
			n := enc.charLen(s, i)
			dst = append(dst, s[i:i+n]...)
			i += n
		case c == '\\' && q == qEscape:
			var n int
			dst, n = appendUnescaped(dst, s, i+1, enc)
			i += 1 + n
		case c == '\'' && q != qBits && i+1 < len(s) && s[i+1] == '\'':
			dst = append(dst, '\'')
			i += 2
		case c == '\'':
			next, ok := continuation(s, i+1)
			if !ok {
				return dst
			}
			i = next
		default:
			dst = append(dst, c)
			i++
		}
	}
	return dst
}

// appendUnescaped appends what the backslash escape at s[i:] (after the
// backslash) stands for in E'...', and returns how many bytes it took: \b,
// \f, \n, \r, \t; \ and one to three octal digits; \x and one or two hex
// digits; \u and four or \U and eight hex digits, a code point in UTF-8 (a
// surrogate or an invalid one is kept as written: the server refuses it);
// any other character stands for itself.
func appendUnescaped(dst []byte, s string, i int, enc Encoding) ([]byte, int) {
	if i >= len(s) {
		return dst, 0
	}
	switch c := s[i]; {
	case c >= '0' && c <= '7':
		v, n := 0, 0
		for ; n < 3 && i+n < len(s) && s[i+n] >= '0' && s[i+n] <= '7'; n++ {
			v = v*8 + int(s[i+n]-'0')
		}
		return append(dst, byte(v)), n
	case c == 'x' && i+1 < len(s) && isHex(s[i+1]):
		v, n := hexValue(s[i+1 : min(i+3, len(s))])
		return append(dst, byte(v)), 1 + n
	case c == 'u' || c == 'U':
		digits := 4
		if c == 'U' {
			digits = 8
		}
		if v, n := hexValue(s[i+1 : min(i+1+digits, len(s))]); n == digits && utf8.ValidRune(rune(v)) {
			return utf8.AppendRune(dst, rune(v)), 1 + n
		}
		return append(dst, '\\', c), 1
	}
	switch s[i] {
	case 'b':
		return append(dst, '\b'), 1
	case 'f':
		return append(dst, '\f'), 1
	case 'n':
		return append(dst, '\n'), 1
	case 'r':
		return append(dst, '\r'), 1
	case 't':
		return append(dst, '\t'), 1
	}
	n := enc.charLen(s, i)
	return append(dst, s[i:i+n]...), n
}

func isHex(c byte) bool { return isDigit(c) || c|0x20 >= 'a' && c|0x20 <= 'f' }

// hexValue reads the hex digits that s starts with: their value and count.
func hexValue[T string | []byte](s T) (v uint32, n int) {
	for ; n < len(s) && isHex(s[n]); n++ {
		c := s[n]
		switch {
		case isDigit(c):
			c -= '0'
		default:
			c = c | 0x20 - 'a' + 10
		}
		v = v<<4 | uint32(c)
	}
	return v, n
}
