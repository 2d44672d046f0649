package kubeinject

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// pointDSN returns a PostgreSQL DSN with its server replaced by a pgwire
// listener (host:port) and sslmode=disable: the leg to the listener is the
// pod's loopback, in plain text (the listener answers SSLRequest with N),
// and TLS to the server is the listener's upstream_tls. Users, passwords,
// the database and every other parameter stay as they were.
//
// It takes both of libpq's forms, the URI (postgres://, postgresql://, and
// jdbc:postgresql://) and keyword=value. It edits the text rather than
// parsing and printing it again, so that $(VAR) references to other
// variables, which Kubernetes expands when the container starts (a
// password from a Secret), are kept as written.
func pointDSN(dsn, listen string) (string, error) {
	switch {
	case strings.TrimSpace(dsn) == "":
		return "", errors.New("empty: it holds no DSN")
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"), strings.HasPrefix(dsn, "jdbc:postgresql://"):
		return pointURI(dsn, listen), nil
	case strings.Contains(dsn, "="):
		return pointKeywords(dsn, listen)
	}
	return "", errors.New("neither a postgres:// URI nor keyword=value pairs")
}

// serverParams are the parameters that name the server; the listener
// replaces them.
var serverParams = []string{"host", "hostaddr", "port"}

func pointURI(dsn, listen string) string {
	schemeEnd := strings.Index(dsn, "://") + len("://")
	rest := dsn[schemeEnd:]
	authorityEnd := strings.IndexAny(rest, "/?#")
	if authorityEnd < 0 {
		authorityEnd = len(rest)
	}
	authority, tail := rest[:authorityEnd], rest[authorityEnd:]
	userinfo := ""
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		userinfo = authority[:at+1]
	}
	fragment := ""
	if i := strings.Index(tail, "#"); i >= 0 {
		tail, fragment = tail[:i], tail[i:]
	}
	pathPart, query, _ := strings.Cut(tail, "?")
	var params []string
	if query != "" {
		for p := range strings.SplitSeq(query, "&") {
			key, _, _ := strings.Cut(p, "=")
			if key == "sslmode" || slices.Contains(serverParams, key) {
				continue
			}
			params = append(params, p)
		}
	}
	params = append(params, "sslmode=disable")
	return dsn[:schemeEnd] + userinfo + listen + pathPart + "?" + strings.Join(params, "&") + fragment
}

// pointKeywords edits "host=db port=5432 password='a b'": the server's
// keywords and sslmode are dropped and the listener's appended.
func pointKeywords(dsn, listen string) (string, error) {
	pairs, err := splitKeywords(dsn)
	if err != nil {
		return "", err
	}
	host, port := listen[:strings.LastIndex(listen, ":")], listen[strings.LastIndex(listen, ":")+1:]
	var kept []string
	for _, p := range pairs {
		if p.key == "sslmode" || slices.Contains(serverParams, p.key) {
			continue
		}
		kept = append(kept, p.text)
	}
	kept = append(kept, "host="+host, "port="+port, "sslmode=disable")
	return strings.Join(kept, " "), nil
}

type keywordPair struct {
	key  string
	text string // as written: key=value, the value quoted or not
}

// splitKeywords reads libpq's keyword=value form: spaces around = are
// allowed; a value is quoted with single quotes, inside which \' and \\
// escape.
func splitKeywords(s string) ([]keywordPair, error) {
	var out []keywordPair
	i := 0
	skipSpace := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skipSpace()
		if i == len(s) {
			return out, nil
		}
		keyStart := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		key := s[keyStart:i]
		skipSpace()
		if i == len(s) || s[i] != '=' || key == "" {
			return nil, fmt.Errorf("%q is not keyword=value", s[keyStart:])
		}
		i++ // =
		skipSpace()
		valueStart := i
		if i < len(s) && s[i] == '\'' {
			i++
			for ; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			if i >= len(s) {
				return nil, fmt.Errorf("the value of %s has no closing quote", key)
			}
			i++
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				i++
			}
		}
		out = append(out, keywordPair{key: key, text: key + "=" + s[valueStart:i]})
	}
}
