package main

import (
	"time"

	"github.com/governor-project/governor/proxy/intercept"
)

// checkInterceptCA looks at the CA of a sidecar config's http.intercept, as
// the operator should before clients trust it: whether it loads and can
// sign now (the sidecar refuses to start otherwise), when it expires, who
// may read its key, and which hosts it may sign for.
func checkInterceptCA(p proxyFile, now time.Time, warnWithin time.Duration) []finding {
	ic := p.cfg.HTTP.Intercept
	if !ic.On() {
		return nil
	}
	subject := p.path + ": http.intercept"
	var out []finding
	for _, f := range intercept.Check(ic.CACert, ic.CAKey, now, warnWithin) {
		level, fix := levelOK, ""
		switch {
		case f.Kind == intercept.FindingUnusable:
			level = levelError
			fix = "point http.intercept.ca_cert and ca_key at a CA and its own key, valid now (governor ca create -out DIR writes a pair); governor-proxy refuses to start with these"
		case f.Kind == intercept.FindingExpiry && f.Warn:
			level = levelWarn
			fix = "make a new CA before then (governor ca create -out DIR -force, with the same -hosts) and restart the workers, which read the CA at start; once it expires, intercepted hosts get no certificate"
		case f.Kind == intercept.FindingKeyMode:
			level = levelWarn
			fix = "chmod 600 " + ic.CAKey + ": only governor-proxy needs to read it, and whoever reads it can impersonate the intercepted hosts to the workers"
		case f.Warn:
			level = levelWarn
		}
		out = append(out, finding{Check: "intercept", Level: level, Subject: subject, Problem: f.Message, Fix: fix})
	}
	return out
}
