// Package server is governord: the gRPC shell around the engine.
//
// The engine decides; this package authenticates, resolves sessions, makes
// every change durable before it replies (write before reply), dedupes
// retries that race the first attempt, reaps what expires, takes snapshots,
// trims what is past its retention and gives the memory back once idle
// (housekeeping.go), and serves metrics and health. It holds no decision
// logic of its own.
//
// A request's life: admission (admission.go, admitcall.go) puts a call of
// new work in its tenant's lane and lets it in by weighted round robin, or
// refuses it with a RetryInfo past its tenant's cap, queue or api_rate
// (apirate.go; its keys in package serverconfig); heartbeats, releases and
// give-backs never wait there → authenticate (the session token in the "authorization"
// metadata, hashed and looked up in the engine) → call the engine under its
// lock, which queues the change's event on the store's log → wait, outside
// the lock, until the log has committed the engine's sequence number → reply.
// A commit that fails stops the daemon: Server.Fatal reports it and the
// process must exit, so no answer that could be lost is ever given. A grant
// whose caller is gone before its answer can be given (its context ended
// during the wait for the commit, or it abandoned the request id) is given
// back (grantCall, and flights for the abandoned ids).
//
// Its configuration, the file and the validated Config, is package
// serverconfig; Start takes a serverconfig.Config.
//
// It may import the engine, the store, the generated API, serverconfig,
// the internal packages for keys and tracing (apikey, tlsreload, tracing) and standard libraries for gRPC, Prometheus and
// OpenTelemetry; never the SDK or proxies. tracing.go:
// the span of a call's commit wait, while tracing is on.
package server
