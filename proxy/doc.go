// Package proxy is governor-proxy's HTTP side: the sidecar a worker points
// HTTP_PROXY and HTTPS_PROXY at, so that its outgoing HTTP is governed
// without any change to its code.
//
// Each request is classified by the rules (package classify); the first rule
// that matches names a lease class and quota charges, which are charged and
// taken in one ChargeAndAcquire call to governord before the request is
// forwarded. The lease is held while the request runs and released when the
// response body ends or the client goes away; a CONNECT tunnel holds its
// lease until the tunnel's connection closes. A request governord refuses
// gets the answer DESIGN.md fixes (429 quota, 503 wait-timeout, 503
// unavailable, 403 task-ended, each with Governor-Denied). When governord
// cannot be reached, new work is denied: the proxy fails closed.
//
// # Files
//
//   - config.go: the YAML file (strict keys, ${VAR}) and the validated Config.
//   - proxy.go: Proxy, Start and Shutdown; wiring goproxy; base-URL routes.
//   - http.go: plain HTTP: decide (classify, admit), forward, release when
//     the body ends, stream bodies of unknown length, upstream errors.
//   - connect.go: CONNECT: admission before goproxy takes the connection
//     over (so a client that leaves the queue is withdrawn), the tunnel
//     connection that holds the lease and closes when idle, and the set of
//     open tunnels.
//   - idle.go: a plain HTTP exchange whose client stops moving bytes is cut
//     off after http.body_idle_timeout, so it cannot hold a lease forever.
//   - deny.go: what a denial or a refusal looks like on the wire.
//   - dial.go: the upstream dialer: no HTTP(S)_PROXY, no link-local or
//     metadata addresses, never the proxy itself.
//   - session.go: the session with governord, redialed in the background;
//     the task and subtask nodes; admit, release and charge calls.
//   - metrics.go: Prometheus series, /healthz and /readyz.
//
// # On top of goproxy
//
// The forward proxy is github.com/elazarl/goproxy. Its known pitfalls are
// handled here: the lease-releasing body wrapper is installed in the round
// tripper, before goproxy keeps the body, so goproxy keeps Content-Length; a
// body of unknown length is marked chunked, which makes goproxy flush each
// piece (SSE, NDJSON); a failed upstream becomes 502 (504 on a timeout)
// instead of goproxy's 500; and Tr.Proxy and ConnectDial, which goproxy
// fills from HTTP(S)_PROXY, are replaced by a dialer that reads no
// environment and refuses the proxy's own listeners.
//
// # Imports
//
// This package may import the standard library, goproxy, golang.org/x/net,
// Prometheus, gopkg.in/yaml.v3, the SDK (package governor), api/governorpb
// and classify. It must not import the server, the engine or the store: it
// speaks to governord only through its API.
package proxy
