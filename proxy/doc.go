// Package proxy is governor-proxy, the sidecar next to each worker: it
// composes an HTTP side (package httpproxy, the forward proxy a worker
// points HTTP_PROXY and HTTPS_PROXY at) and a PostgreSQL side (package
// pgwire, the listeners a worker's DSN points at) over one admission layer
// (package admission's vocabulary; package budget's Admitter, the one
// session with governord and the budgets it delegates), with the rules of
// package classify, one config file (package proxyconfig: the YAML file
// and the validated Config that Start takes) and one metrics and health
// server.
//
//	                 ┌──────────── Sidecar ────────────┐
//	worker ─HTTP───▶ │ httpproxy ──┐                   │
//	       ─SQL────▶ │ pgwire ─────┼─▶ admission ─▶ budget ─gRPC─▶ governord
//	                 │ classify ───┘   (Request, Ticket, Denial)   │
//	                 └─────────────────────────────────┘
//
// A unit of work (an HTTP request, a CONNECT tunnel, a SQL transaction) is
// classified by the first rule that matches, admitted (quota charged, a
// slot of its class held) and forwarded; its ticket ends when the response
// body ends, the tunnel closes or the transaction is idle again. A refusal
// is a *admission.Denial, rendered once as HTTP (httpproxy/deny.go) and once
// as a SQLSTATE (pgwire/admit.go), as docs/proxy.md's table of denials fixes.
//
// # Files
//
//   - sidecar.go: Start (build, listen, serve) and Shutdown; the rule watcher.
//   - pgwire.go: the pgwire listeners, and the gate that drains their
//     transactions at shutdown.
//   - metrics.go: /metrics, /healthz and /readyz.
//
// # Imports
//
// This package may import the standard library, Prometheus, yaml.v3, the
// SDK, classify, the internal packages for keys, certificates and tracing
// (apikey, tlsreload, tracing), its
// own subpackages and pgwire (the SQL side, a package of its own at the
// top of the tree, which imports proxy/admission). It must not import the server, the engine or the store:
// it speaks to governord only through its API.
package proxy
