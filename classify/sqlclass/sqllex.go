package sqlclass

import "strings"

// tokKind is what the lexer tells apart: only as much as classification
// needs. Strings, numbers and operators are kept only as markers; their text
// is never looked at.
type tokKind uint8

const (
	tokIdent  tokKind = iota // unquoted identifier or keyword, folded to lower case
	tokQIdent                // "quoted" identifier, as written between the quotes
	tokString                // any string literal or dollar-quoted body
	tokNumber
	tokParam // $1
	tokOp    // any other punctuation, one byte at a time
	tokLParen
	tokRParen
	tokComma
	tokDot
	tokSemi
)

type token struct {
	kind tokKind
	text string // identifiers only
}

// is reports whether t is the unquoted keyword kw (lower case).
func (t token) is(kw string) bool { return t.kind == tokIdent && t.text == kw }

// lex splits sql into tokens. It never fails: an unterminated string,
// quoted identifier or comment runs to the end of the text, as it would make
// the server report a syntax error anyway. It assumes
// standard_conforming_strings = on (the default since PostgreSQL 9.1): a
// backslash escapes only inside E'...'.
func lex(sql string, toks []token) []token {
	i, n := 0, len(sql)
	for i < n {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && i+1 < n && sql[i+1] == '-':
			for i < n && sql[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < n && sql[i+1] == '*':
			i = skipBlockComment(sql, i)
		case c == '\'':
			i = skipQuoted(sql, i+1, '\'', false)
			toks = append(toks, token{kind: tokString})
		case c == '"':
			end := skipQuoted(sql, i+1, '"', false)
			toks = append(toks, token{kind: tokQIdent, text: unquoteIdent(sql[i+1 : max(i+1, end-1)])})
			i = end
		case (c == 'e' || c == 'E') && i+1 < n && sql[i+1] == '\'':
			i = skipQuoted(sql, i+2, '\'', true)
			toks = append(toks, token{kind: tokString})
		case (c == 'b' || c == 'B' || c == 'x' || c == 'X' || c == 'n' || c == 'N') && i+1 < n && sql[i+1] == '\'':
			i = skipQuoted(sql, i+2, '\'', false)
			toks = append(toks, token{kind: tokString})
		case (c == 'u' || c == 'U') && i+2 < n && sql[i+1] == '&' && (sql[i+2] == '\'' || sql[i+2] == '"'):
			q := sql[i+2]
			end := skipQuoted(sql, i+3, q, false)
			if q == '"' {
				toks = append(toks, token{kind: tokQIdent, text: unquoteIdent(sql[i+3 : max(i+3, end-1)])})
			} else {
				toks = append(toks, token{kind: tokString})
			}
			i = end
		case c == '$':
			if i+1 < n && isDigit(sql[i+1]) {
				i += 2
				for i < n && isDigit(sql[i]) {
					i++
				}
				toks = append(toks, token{kind: tokParam})
				break
			}
			if end, ok := skipDollar(sql, i); ok {
				i = end
				toks = append(toks, token{kind: tokString})
				break
			}
			toks = append(toks, token{kind: tokOp})
			i++
		case isIdentStart(c):
			j := i + 1
			for j < n && isIdentCont(sql[j]) {
				j++
			}
			toks = append(toks, token{kind: tokIdent, text: foldIdent(sql[i:j])})
			i = j
		case isDigit(c) || (c == '.' && i+1 < n && isDigit(sql[i+1])):
			j := i + 1
			for j < n && (isIdentCont(sql[j]) || sql[j] == '.' ||
				((sql[j] == '+' || sql[j] == '-') && (sql[j-1] == 'e' || sql[j-1] == 'E'))) {
				j++
			}
			toks = append(toks, token{kind: tokNumber})
			i = j
		case c == '(':
			toks = append(toks, token{kind: tokLParen})
			i++
		case c == ')':
			toks = append(toks, token{kind: tokRParen})
			i++
		case c == ',':
			toks = append(toks, token{kind: tokComma})
			i++
		case c == '.':
			toks = append(toks, token{kind: tokDot})
			i++
		case c == ';':
			toks = append(toks, token{kind: tokSemi})
			i++
		default:
			toks = append(toks, token{kind: tokOp})
			i++
		}
	}
	return toks
}

// skipBlockComment returns the index after the /* ... */ comment at i.
// Block comments nest in PostgreSQL.
func skipBlockComment(s string, i int) int {
	depth := 0
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

// skipQuoted returns the index after the closing quote q of a literal whose
// body starts at i. A doubled quote is an escaped quote; with backslash, so
// is a backslash followed by anything.
func skipQuoted(s string, i int, q byte, backslash bool) int {
	for i < len(s) {
		switch c := s[i]; {
		case backslash && c == '\\':
			i += 2
		case c == q:
			if i+1 < len(s) && s[i+1] == q {
				i += 2
				continue
			}
			return i + 1
		default:
			i++
		}
	}
	return len(s)
}

// skipDollar reports whether a dollar quote ($$ or $tag$) starts at i and,
// if so, returns the index after its closing delimiter.
func skipDollar(s string, i int) (int, bool) {
	j := i + 1
	for j < len(s) && s[j] != '$' {
		if !isIdentCont(s[j]) || s[j] == '$' || (j == i+1 && isDigit(s[j])) {
			return 0, false
		}
		j++
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

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentCont(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

// foldIdent lower-cases an unquoted identifier as PostgreSQL does: ASCII
// letters only. It does not allocate when there is nothing to fold.
func foldIdent(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

func unquoteIdent(s string) string {
	if strings.Contains(s, `""`) {
		return strings.ReplaceAll(s, `""`, `"`)
	}
	return s
}
