package httpproxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
)

// authRealm is the realm of the 407's Proxy-Authenticate challenge.
const authRealm = "governor-proxy"

// authorized reports whether r's Proxy-Authorization carries
// Config.Password: Basic credentials whose password it is (the username,
// the subtask, is read by decide). The comparison takes the same time
// whatever the password given.
func (p *Proxy) authorized(r *http.Request) bool {
	scheme, cred, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Proxy-Authorization")), " ")
	if !strings.EqualFold(scheme, "Basic") {
		return false
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return false
	}
	_, pw, _ := strings.Cut(string(dec), ":")
	got, want := sha256.Sum256([]byte(pw)), sha256.Sum256([]byte(p.Config.Password))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// proxyAuthRequired answers a request without the password: 407 with a
// Basic challenge, as HTTP has a proxy ask for credentials, and
// Governor-Denied: proxy-auth. Nothing is charged, classified or dialed.
// The log line names neither the username nor what was sent.
func (p *Proxy) proxyAuthRequired(w http.ResponseWriter, r *http.Request) {
	p.m.requests.WithLabelValues(ruleUnmatched, outcomeRefused).Inc()
	p.m.denials.WithLabelValues(causeProxyAuth).Inc()
	why := "Proxy-Authorization has no password"
	if r.Header.Get("Proxy-Authorization") != "" {
		why = "the password in Proxy-Authorization is wrong"
	}
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "decision", slog.String("kind", kindOf(r)),
		slog.String("outcome", "denied"), slog.String("cause", causeProxyAuth), slog.String("remote", r.RemoteAddr))
	ref := &refusal{code: http.StatusProxyAuthRequired, reason: "Proxy Authentication Required", cause: causeProxyAuth,
		header: http.Header{"Proxy-Authenticate": {`Basic realm="` + authRealm + `"`}},
		err:    errors.New(why + "; this proxy needs the password its config names (http.password), e.g. HTTP_PROXY=http://subtask:PASSWORD@host:port")}
	resp := ref.response(r)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	if r.Method == http.MethodConnect {
		// No tunnel follows: the client may send its next request (with
		// credentials) on a new connection.
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

func kindOf(r *http.Request) string {
	if r.Method == http.MethodConnect {
		return "connect"
	}
	return "http"
}
