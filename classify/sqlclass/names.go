package sqlclass

import (
	"unicode/utf16"
	"unicode/utf8"
)

// identText is an identifier's name, as the server reads it.
func (c *classifier) identText(t token) string {
	var p nameParts
	p.start(t)
	return string(c.nameBytes(&p))
}

// nameBytes writes a qualified name into c.buf, each part as the server
// reads it (appendName) and cut to nameLen bytes as the server cuts
// identifiers.
func (c *classifier) nameBytes(p *nameParts) []byte {
	b := c.buf[:0]
	for i := 0; i < p.n; i++ {
		if i > 0 {
			b = append(b, '.')
		}
		start := len(b)
		b = c.appendName(b, p.parts[i], start+nameLen)
		b = cutName(b, start)
	}
	return b
}

// appendName appends the name the identifier t stands for, as the server
// reads it: unquoted, with the ASCII letters folded to lower case and no
// others (what the server folds in a database of a multibyte encoding:
// scansup.c's downcase_identifier); quoted, with "" as "; U&"...", decoded.
// It stops once dst reaches limit bytes, a decoded character or an escape
// kept as written at most past it.
func (c *classifier) appendName(dst []byte, t token, limit int) []byte {
	s := c.lx.src[t.start:t.end]
	switch {
	case t.kind == tokUIdent:
		// The escapes are decoded in the body with "" already made ",
		// as the server decodes them; enough of it to fill limit.
		u := c.ubuf[:0]
		for j := 0; j < len(s) && len(u) < cap(u); j++ {
			if s[j] == '"' && j+1 < len(s) && s[j+1] == '"' {
				j++
			}
			u = append(u, s[j])
		}
		return appendDecoded(dst, u, c.lx.escapeOf(t), c.lx.set.Encoding, limit)
	case t.kind == tokQIdent:
		for j := 0; j < len(s) && len(dst) < limit; j++ {
			if s[j] == '"' && j+1 < len(s) && s[j+1] == '"' {
				j++
			}
			dst = append(dst, s[j])
		}
	default:
		for j := 0; j < len(s) && len(dst) < limit; j++ {
			ch := s[j]
			if ch >= 'A' && ch <= 'Z' {
				ch += 'a' - 'A'
			}
			dst = append(dst, ch)
		}
	}
	return dst
}

// maxEscapedName bounds the body of a U& identifier that is decoded: the
// longest escape that decodes to one byte is an escape character and
// +XXXXXX, so this much always fills nameLen bytes or ends the name.
const maxEscapedName = (utf8.UTFMax + len("+XXXXXX")) * (nameLen + 1)

// appendDecoded appends the body u of a U& identifier, decoded with escape
// e as the server decodes it (parser.c's str_udeescape), until dst reaches
// limit. What the server would refuse is kept as written (see uescape.go).
func appendDecoded(dst, u []byte, e escape, enc Encoding, limit int) []byte {
	el := e.len()
	var high rune     // a high surrogate waiting for its low half
	var highAs []byte // and how it was written
	flush := func() {
		if high != 0 {
			dst = append(dst, highAs...)
			high = 0
		}
	}
	for i := 0; i < len(u) && len(dst) < limit; {
		if !e.at(u, i) {
			flush()
			n := 1
			if u[i] >= 0x80 {
				n = charLen(enc, u, i)
			}
			dst = append(dst, u[i:i+n]...)
			i += n
			continue
		}
		if e.at(u, i+el) {
			flush()
			dst = e.appendTo(dst)
			i += 2 * el
			continue
		}
		r, n := escapedRune(u[i+el:])
		if n == 0 {
			flush()
			dst = e.appendTo(dst)
			i += el
			continue
		}
		written := u[i : i+el+n]
		i += el + n
		if high != 0 {
			if r >= 0xdc00 && r <= 0xdfff {
				dst = utf8.AppendRune(dst, utf16.DecodeRune(high, r))
				high = 0
				continue
			}
			flush()
		}
		switch {
		case r >= 0xd800 && r <= 0xdbff:
			high, highAs = r, written
		case r == 0 || !utf8.ValidRune(r):
			dst = append(dst, written...)
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	flush()
	return dst
}

// escapedRune reads what follows an escape character: four hex digits, or
// + and six; it returns the code point and the bytes read, 0 when neither
// form is there.
func escapedRune(b []byte) (rune, int) {
	digits, skip := 4, 0
	if len(b) > 0 && b[0] == '+' {
		digits, skip = 6, 1
	}
	if len(b) < skip+digits {
		return 0, 0
	}
	v, n := hexValue(b[skip : skip+digits])
	if n != digits {
		return 0, 0
	}
	return rune(v), skip + digits
}

// cutName cuts the name that starts at b[start] to nameLen bytes, as the
// server truncates identifiers, and never inside a UTF-8 character.
func cutName(b []byte, start int) []byte {
	if len(b)-start < nameLen {
		return b
	}
	b = b[:start+nameLen]
	for k := len(b); k > start && k > len(b)-utf8.UTFMax; k-- {
		if utf8.RuneStart(b[k-1]) {
			if !utf8.FullRune(b[k-1:]) {
				b = b[:k-1]
			}
			break
		}
	}
	return b
}
