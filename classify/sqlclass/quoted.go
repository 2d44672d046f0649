package sqlclass

import "strings"

// quoting is how the server reads the body of a string literal: which of
// its lexer's states (scan.l's xq, xe, xus, xb and xh) reads it.
type quoting uint8

const (
	// qStandard: '...' (and N'...') with standard_conforming_strings on;
	// '' is a quote.
	qStandard quoting = iota + 1
	// qEscape: E'...', and '...' with standard_conforming_strings off; a
	// backslash escapes the next character too.
	qEscape
	// qUnicode: U&'...', read as qStandard whatever the setting (the server
	// refuses it when standard_conforming_strings is off); its escapes are
	// decoded after.
	qUnicode
	// qBits: B'...' and X'...'; the first quote ends the body, so B'1''0'
	// is B'1' then '0'.
	qBits
)

// plainQuoting is how '...' reads under the lexer's settings.
func (l *lexer) plainQuoting() quoting {
	if l.set.BackslashEscapes {
		return qEscape
	}
	return qStandard
}

// skipString returns the index after the string literal whose first body
// starts at i (after its opening quote), read as q reads it. A literal goes
// on past its closing quote when whitespace holding a newline, and then
// another quoted body, follow:
//
//	SELECT 'a'
//	       'b'
//
// is the one string 'ab', and the server reads the next body as it read
// the first: after E'...', a backslash escapes there too.
func (l *lexer) skipString(i int, q quoting) int {
	for {
		end, closed := l.skipQuoted(i, '\'', q != qBits, q == qEscape)
		if !closed {
			return end
		}
		next, ok := continuation(l.src, end)
		if !ok {
			return end
		}
		i = next
	}
}

// continuation reports whether a string literal that ends at i goes on,
// and if so returns the index after the next body's opening quote: the
// whitespace between (spaces and -- comments) must hold a newline. Block
// comments do not count, as they do not for the server.
func continuation(s string, i int) (int, bool) {
	newline := false
	for i < len(s) {
		switch c := s[i]; {
		case c == '\n' || c == '\r':
			newline = true
			i++
		case isSpace(c):
			i++
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			i = lineEnd(s, i)
		case c == '\'' && newline:
			return i + 1, true
		default:
			return 0, false
		}
	}
	return 0, false
}

// skipQuotedIdent returns where the text of the quoted identifier whose
// body starts at i ends (before its closing quote, or at the end of the
// text when it is not closed) and the index after it.
func (l *lexer) skipQuotedIdent(i int) (end, after int) {
	after, closed := l.skipQuoted(i, '"', true, false)
	if closed {
		return after - 1, after
	}
	return after, after
}

// skipQuoted returns the index after the closing quote q of a body that
// starts at i, and whether there was one (an unclosed body runs to the end
// of the text). With doubled, qq is an escaped quote; with backslash, a
// backslash escapes the next character. In a client-only encoding a
// character is skipped whole, so that a byte inside one (a backslash, say)
// is never taken for itself.
func (l *lexer) skipQuoted(i int, q byte, doubled, backslash bool) (int, bool) {
	s, enc := l.src, l.set.Encoding
	for i < len(s) {
		c := s[i]
		switch {
		case c >= 0x80 && enc != ASCIISafe:
			i += enc.charLen(s, i)
		case backslash && c == '\\':
			// The next character is escaped, whole: its last byte may be a
			// backslash or a quote in a client-only encoding.
			i++
			if i < len(s) {
				i += enc.charLen(s, i)
			}
		case c == q:
			if doubled && i+1 < len(s) && s[i+1] == q {
				i += 2
				continue
			}
			return i + 1, true
		default:
			i++
		}
	}
	return len(s), false
}

// skipDollar reports whether a dollar quote ($$ or $tag$) starts at i and,
// if so, returns the index after its closing delimiter. A tag is letters,
// digits (not first), _ and non-ASCII characters, whole ones in a
// client-only encoding. No character of any encoding the server accepts
// holds a '$' byte, so the closing delimiter is found by its bytes.
func (l *lexer) skipDollar(i int) (int, bool) {
	s, enc := l.src, l.set.Encoding
	j := i + 1
	for j < len(s) && s[j] != '$' {
		switch c := s[j]; {
		case c >= 0x80:
			j += enc.charLen(s, j)
		case isIdentStart(c) || (isDigit(c) && j > i+1):
			j++
		default:
			return 0, false
		}
	}
	if j >= len(s) {
		return 0, false
	}
	delim := s[i : j+1]
	k := strings.Index(s[j+1:], delim)
	if k < 0 {
		return len(s), true
	}
	return j + 1 + k + len(delim), true
}
