package classify

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// A pathPattern matches a leading run of whole path segments. See the package
// documentation for the rules; in short:
//
//	/v1          /v1, /v1/, /v1/models; not /v1beta
//	/v1/         /v1/, /v1/models; not /v1
//	/v1/*        /v1/, /v1/models, /v1/chat/completions
//	/v1/*/x      /v1/chat/x, /v1/chat/x/y; not /v1/a/b/x
//	/v1/**/x     /v1/x, /v1/a/b/x, /v1/a/b/x/y
//	/            every path
//
// A * (or ?, or a set) never crosses a "/"; a segment that is exactly **
// matches any number of whole segments, including none.
type pathPattern struct {
	src  string
	segs []pathSeg
}

type pathSeg struct {
	any  bool  // ** (also the synthetic tail that allows a continuation)
	glob *glob // nil when any
}

func compilePath(pattern string) (*pathPattern, error) {
	if pattern == "" {
		return nil, errEmptyPattern
	}
	if pattern[0] != '/' {
		return nil, fmt.Errorf("%q does not start with /", pattern)
	}
	p := &pathPattern{src: pattern}
	body := pattern[1:]
	trailing := strings.HasSuffix(body, "/") || body == ""
	body = strings.TrimSuffix(body, "/")
	if body != "" {
		for _, s := range strings.Split(body, "/") {
			if s == "**" {
				if n := len(p.segs); n > 0 && p.segs[n-1].any {
					continue
				}
				p.segs = append(p.segs, pathSeg{any: true})
				continue
			}
			if strings.Contains(s, "**") {
				return nil, fmt.Errorf("bad glob %q: ** must be a whole path segment", pattern)
			}
			if s == "" {
				return nil, fmt.Errorf("%q has an empty segment (//)", pattern)
			}
			g, err := compileGlob(s, false)
			if err != nil {
				if errors.Is(err, errEmptyPattern) {
					return nil, fmt.Errorf("%q has an empty segment", pattern)
				}
				return nil, fmt.Errorf("bad glob %q: %s", pattern, strings.TrimPrefix(err.Error(), fmt.Sprintf("bad glob %q: ", s)))
			}
			p.segs = append(p.segs, pathSeg{glob: g})
		}
	}
	// A leading run of whole segments: the pattern, then either nothing more
	// or "/" and anything. A trailing slash demands the "/". Both are the
	// pattern followed by a tail that matches the rest, so one full-match
	// algorithm serves.
	if trailing {
		p.segs = append(p.segs, pathSeg{glob: matchAnySegment})
	}
	if n := len(p.segs); n == 0 || !p.segs[n-1].any {
		p.segs = append(p.segs, pathSeg{any: true})
	}
	return p, nil
}

// matchAnySegment matches one segment, whatever it holds (even nothing).
var matchAnySegment = &glob{src: "*", elems: []elem{{kind: elemStar}}}

// match reports whether p matches the path s, which starts with "/".
func (p *pathPattern) match(s string) bool {
	if s == "" || s[0] != '/' {
		return false
	}
	rest := s[1:] // segments of rest, split at "/"; "" is one empty segment
	n := strings.Count(rest, "/") + 1
	// seg returns segment i of rest, scanning forward from a cursor so that a
	// full pass is linear.
	var curIdx, curOff int
	seg := func(i int) string {
		if i < curIdx {
			curIdx, curOff = 0, 0
		}
		for curIdx < i {
			j := strings.IndexByte(rest[curOff:], '/')
			curOff += j + 1
			curIdx++
		}
		if j := strings.IndexByte(rest[curOff:], '/'); j >= 0 {
			return rest[curOff : curOff+j]
		}
		return rest[curOff:]
	}
	pi, si := 0, 0
	starPi, starSi := -1, 0
	for {
		if pi < len(p.segs) {
			ps := &p.segs[pi]
			if ps.any {
				starPi, starSi = pi, si
				pi++
				continue
			}
			if si < n && ps.glob.match(seg(si)) {
				pi++
				si++
				continue
			}
		} else if si == n {
			return true
		}
		if starPi < 0 || starSi >= n {
			return false
		}
		starSi++
		pi, si = starPi+1, starSi
	}
}

func (p *pathPattern) String() string { return p.src }

// cleanPath returns the path a rule sees: "." and ".." segments resolved and
// repeated slashes folded, so that /v1//admin or /v1/x/../admin cannot slip
// past a rule for /v1/admin. A trailing slash is kept. It allocates only
// when the path is not already clean.
func cleanPath(p string) string {
	if isCleanPath(p) {
		return p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

func isCleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	for i := 1; i < len(p); i++ {
		if p[i-1] != '/' {
			continue
		}
		switch {
		case p[i] == '/':
			return false
		case p[i] == '.' && (i+1 == len(p) || p[i+1] == '/'):
			return false
		case p[i] == '.' && p[i+1] == '.' && (i+2 == len(p) || p[i+2] == '/'):
			return false
		}
	}
	return true
}
