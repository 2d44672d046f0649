package classify

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// A glob is a compiled shell-style pattern. It always matches the whole
// subject:
//
//   - any run of characters, including none
//     ?       exactly one character
//     [abc]   one character of the set; ranges like [a-z]; [!a-z] or [^a-z] negates
//     \x      the character x itself (so \* is a literal star)
//
// Sets hold ASCII only. A pattern without metacharacters is compared as a plain
// string. Matching runs in O(len(pattern)·len(subject)) at worst (one
// backtrack point, never exponential) and does not allocate.
type glob struct {
	src     string // as written, for messages
	fold    bool   // ASCII case-insensitive; the compiled pattern is lower case
	literal bool   // no metacharacters: compare lit
	lit     string
	elems   []elem
	// Literal runs the subject must start and end with: a cheap test that
	// turns most non-matches away before the general algorithm runs.
	prefix, suffix string
}

type elemKind uint8

const (
	elemLit   elemKind = iota // a run of literal bytes
	elemOne                   // ?
	elemStar                  // *
	elemClass                 // [...]
)

type elem struct {
	kind  elemKind
	lit   string
	class *charClass
}

// charClass is a set of ASCII bytes. A negated class also matches every
// non-ASCII character.
type charClass struct {
	neg  bool
	bits [2]uint64
}

func (c *charClass) has(b byte) bool {
	if b >= utf8.RuneSelf {
		return c.neg
	}
	in := c.bits[b>>6]&(1<<(b&63)) != 0
	return in != c.neg
}

func (c *charClass) add(b byte) { c.bits[b>>6] |= 1 << (b & 63) }

var errEmptyPattern = errors.New("is empty")

// compileGlob compiles pattern. With fold set, matching ignores ASCII case.
func compileGlob(pattern string, fold bool) (*glob, error) {
	if pattern == "" {
		return nil, errEmptyPattern
	}
	g := &glob{src: pattern, fold: fold}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			g.elems = append(g.elems, elem{kind: elemLit, lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '\\':
			if i+1 == len(pattern) {
				return nil, fmt.Errorf("bad glob %q: it ends with an escape (\\)", pattern)
			}
			i++
			lit.WriteByte(lowerIf(fold, pattern[i]))
		case '*':
			flush()
			if n := len(g.elems); n > 0 && g.elems[n-1].kind == elemStar {
				continue // ** is the same as * here
			}
			g.elems = append(g.elems, elem{kind: elemStar})
		case '?':
			flush()
			g.elems = append(g.elems, elem{kind: elemOne})
		case '[':
			flush()
			cls, n, err := compileClass(pattern[i:], fold)
			if err != nil {
				return nil, fmt.Errorf("bad glob %q: %v", pattern, err)
			}
			g.elems = append(g.elems, elem{kind: elemClass, class: cls})
			i += n - 1
		default:
			lit.WriteByte(lowerIf(fold, c))
		}
	}
	flush()
	if len(g.elems) == 1 && g.elems[0].kind == elemLit {
		g.literal, g.lit, g.elems = true, g.elems[0].lit, nil
		return g, nil
	}
	if first := g.elems[0]; first.kind == elemLit {
		g.prefix = first.lit
	}
	if last := g.elems[len(g.elems)-1]; last.kind == elemLit {
		g.suffix = last.lit
	}
	return g, nil
}

// compileClass compiles the set at the start of s ("[...]") and returns it
// with the number of bytes it spans.
func compileClass(s string, fold bool) (*charClass, int, error) {
	c := &charClass{}
	i := 1
	if i < len(s) && (s[i] == '!' || s[i] == '^') {
		c.neg = true
		i++
	}
	start := i
	for {
		if i >= len(s) {
			return nil, 0, errors.New("a [ is not closed")
		}
		if s[i] == ']' && i > start {
			break
		}
		if s[i] == ']' {
			return nil, 0, errors.New("a [] set is empty")
		}
		lo, n, err := classChar(s[i:])
		if err != nil {
			return nil, 0, err
		}
		i += n
		hi := lo
		if i+1 < len(s) && s[i] == '-' && s[i+1] != ']' {
			hi, n, err = classChar(s[i+1:])
			if err != nil {
				return nil, 0, err
			}
			i += 1 + n
			if hi < lo {
				return nil, 0, fmt.Errorf("range %c-%c is reversed", lo, hi)
			}
		}
		for b := int(lo); b <= int(hi); b++ {
			c.add(byte(b))
			if fold {
				c.add(lower(byte(b)))
				c.add(upper(byte(b)))
			}
		}
	}
	return c, i + 1, nil
}

func classChar(s string) (byte, int, error) {
	n := 1
	if s[0] == '\\' {
		if len(s) < 2 {
			return 0, 0, errors.New("a [ is not closed")
		}
		s, n = s[1:], 2
	}
	if s[0] >= utf8.RuneSelf {
		return 0, 0, errors.New("a [] set may hold only ASCII characters")
	}
	return s[0], n, nil
}

// match reports whether the whole of s matches the pattern.
func (g *glob) match(s string) bool {
	if g.literal {
		if g.fold {
			return equalFoldLower(s, g.lit)
		}
		return s == g.lit
	}
	if len(s) < len(g.prefix)+len(g.suffix) || !hasPrefix(s, g.prefix, g.fold) ||
		!hasPrefix(s[len(s)-len(g.suffix):], g.suffix, g.fold) {
		return false
	}
	// Greedy with one backtrack point: the last star seen. Backtracking to an
	// earlier star can never help, because the last star can absorb anything
	// an earlier one could.
	pi, si := 0, 0
	starPi, starSi := -1, 0
	for {
		if pi < len(g.elems) {
			e := &g.elems[pi]
			switch e.kind {
			case elemStar:
				starPi, starSi = pi, si
				pi++
				continue
			case elemLit:
				if hasPrefix(s[si:], e.lit, g.fold) {
					pi++
					si += len(e.lit)
					continue
				}
			case elemOne:
				if si < len(s) {
					_, n := utf8.DecodeRuneInString(s[si:])
					pi++
					si += n
					continue
				}
			case elemClass:
				if si < len(s) && e.class.has(s[si]) {
					_, n := utf8.DecodeRuneInString(s[si:])
					pi++
					si += n
					continue
				}
			}
		} else if si == len(s) {
			return true
		}
		if starPi < 0 || starSi >= len(s) {
			return false
		}
		_, n := utf8.DecodeRuneInString(s[starSi:])
		starSi += n
		pi, si = starPi+1, starSi
	}
}

func (g *glob) String() string { return g.src }

func hasPrefix(s, prefix string, fold bool) bool {
	if len(s) < len(prefix) {
		return false
	}
	if !fold {
		return s[:len(prefix)] == prefix
	}
	return equalFoldLower(s[:len(prefix)], prefix)
}

// equalFoldLower compares s with lowerPattern, which is already lower case,
// ignoring the ASCII case of s.
func equalFoldLower(s, lowerPattern string) bool {
	if len(s) != len(lowerPattern) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if lower(s[i]) != lowerPattern[i] {
			return false
		}
	}
	return true
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

func upper(b byte) byte {
	if 'a' <= b && b <= 'z' {
		return b - ('a' - 'A')
	}
	return b
}

func lowerIf(fold bool, b byte) byte {
	if fold {
		return lower(b)
	}
	return b
}
