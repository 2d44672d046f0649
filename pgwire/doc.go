// Package pgwire is governor-proxy's PostgreSQL wire proxy: it relays the v3
// protocol between clients and one upstream server, classifies each
// transaction's SQL (classify/sqlclass) through classify's rules, and
// admits it through an admission.Admitter (a slot per transaction, quota
// charges per statement), so a worker whose DSN points at the sidecar is
// governed without code changes.
//
// It may import the standard library, classify and classify/sqlclass,
// proxy/admission, Prometheus' client and
// github.com/jackc/pgx/v5/pgproto3 (to encode the few messages the proxy
// writes itself); never the server, the engine, the SDK or the HTTP side.
//
// # A connection's life, by file
//
//   - wire.go: framing. Typed message constants; the startup packet is
//     capped at MaxStartupPacketSize, a client's password or SASL message
//     at MaxAuthMessageSize (PostgreSQL's own caps, before login), and
//     every later message at Proxy.MaxMessageSize, checked on the header
//     before any buffer is allocated. A buffer grown for one large message
//     is let go after it.
//   - proxy.go: Proxy.Serve accepts; Close stops it and waits; failures are
//     counted by kind (Counts); CancelRequest routing by the proxy's own
//     (pid, key); the upstream dial, plain or TLS.
//   - conn.go: the shell around the machine, in order: the startup
//     packets read (a TLS handshake taken, a CancelRequest served, the
//     server dialled, plain or TLS, as the machine says); the login
//     relayed; then two goroutines relay both directions at once,
//     streaming raw bytes and framing only Query, Parse, Bind, Execute,
//     Close, Sync and FunctionCall from the client and ReadyForQuery and
//     ErrorResponse from the server (ParameterStatus, ParseComplete,
//     CloseComplete and CommandComplete are peeked at). It reads, asks
//     admission and writes, feeding the machine what it frames and
//     carrying out the actions it returns. It decides nothing of the
//     protocol; what the rules say and what admission answers are
//     govern.go's.
//   - machine.go: the protocol's logic, as a machine with no I/O, clock or
//     goroutine (as etcd's raft is): a client's message, a server's
//     message, admission's verdict, the end of a wait or the connection's
//     end in; actions out (forward, drop, send the server or the client a
//     message of the proxy's, ask admission, wait for the server, end the
//     leases). It holds what the connection's state is: the ReadyForQuery
//     answers owed, the transaction's leases, the discard after a denial,
//     the prepared statements, the settings text is lexed with. Its
//     traces are testdata/machine/*.txt (machine_test.go).
//   - login.go: the machine's first phases. Startup: SSLRequest answered
//     'N' or with TLS, GSSENCRequest 'N', CancelRequest served, protocol
//     3.x, forced to 3.0 upstream. Login: authentication relayed (trust,
//     cleartext, MD5, SCRAM; SCRAM-SHA-256-PLUS hidden when the upstream
//     leg is TLS); BackendKeyData's secret replaced (its pid is the
//     server's, so that pg_backend_pid() and pg_terminate_backend agree
//     with the client); the first ReadyForQuery starts the relay.
//   - lifecycle.go: how a connection ends, from either side. When the
//     server's side ends (pg_terminate_backend, a crash, Proxy.Close), the
//     client gets what the server sent and a FATAL, the transaction's slot
//     goes back, and the client's connection closes, at once.
//   - govern.go: each statement matched to its rule; the transaction's
//     leases (one per class) and the statements' charges admitted, when
//     the machine asks.
//   - statements.go: what a message runs, as the server will run it (the
//     machine's resolve): its text classified under the lexing settings
//     the server reports, the connection's prepared statements and
//     portals; and when that waits for the server's answers.
//   - result.go: what statements of rules with result: return, counted
//     from the server's DataRows (the machine attaches each charge to the
//     ReadyForQuery its message is owed) and charged as it streams.
//   - notice.go: the NOTICE a transaction near or over a cap gets
//     (cap_notices), and the dry runs of rules in shadow mode.
//   - admit.go: the one rendering of a denial as a SQLSTATE.
//   - metrics.go: the side's series.
//
// # Transactions and leases
//
// A connection is busy from the first statement the proxy admits after the
// server reported ReadyForQuery 'I' with nothing in flight, until a
// ReadyForQuery 'I' arrives with no further Query, FunctionCall or Sync
// outstanding and no unsynced extended-protocol message sent. That span
// holds one lease of each class its statements' rules name, each taken
// before the first statement that needs it is sent and held to the span's
// end; a wait for one is bounded by the wait timeout (two transactions
// taking two classes in opposite orders wait for each other that long).
// Every statement is charged before it is sent: a message's charges are
// summed and taken with its last lease, all or none. A pipelined client
// may keep a connection busy across several implicit transactions; the
// leases span them. Each is released with its latency and overloaded set
// when the server sent SQLSTATE class 53, 57014 or 40001, before the
// ReadyForQuery that ends the span is forwarded (a client that starts its
// next transaction at once, on any connection, finds the slot free); a
// connection that ends, on either side, releases them too. Statements are
// admitted on Query, FunctionCall (kind "function") and Execute
// (classified by the statement behind its portal, at each execution);
// Parse and Bind run nothing and are not admitted.
//
// # Denials
//
// A denied statement never reaches the server; the client gets an ERROR
// (never FATAL) with the SQLSTATE docs/proxy.md gives and the connection stays
// usable. When the connection is idle with nothing in flight the proxy
// answers alone (ErrorResponse, ReadyForQuery 'I'). Otherwise the server
// must agree on the transaction's state, so the proxy sends it, in the
// denied statement's place, a statement that fails without side effects
// (a constant cast to int4, which fails in parse analysis and names itself
// in the server log), and shows the client the denial instead of that
// error. Inside BEGIN the server's transaction is thereby aborted and the
// client sees status 'E': a later COMMIT rolls back. In the extended
// protocol the failing statement is sent as a Parse of the unnamed
// statement, and the client's messages up to Sync are discarded (Flush is
// passed on). If the server had already failed earlier in the same batch,
// the client sees that earlier error rather than the denial.
//
// # Classification
//
// Statements are classified by classify/sqlclass, whose results are cached
// by lexing settings and statement text in a bounded LRU shared by a
// Proxy's connections (CacheEntries). Each statement of a Query is matched
// on its own. SQL's PREPARE, EXECUTE, DEALLOCATE and DISCARD ALL and the
// protocol's Parse, Bind and Close share the server's namespace of prepared
// statements, and the proxy follows it per connection as the server will
// have it (statements.go): whatever runs a prepared statement is governed
// as that statement, every time. A text is lexed with the
// standard_conforming_strings and client_encoding the server reports.
//
// # Known gaps
//
// SCRAM with TLS on both legs: a libpq or pgx client on TLS that is offered
// only SCRAM-SHA-256 sends the "y" channel-binding flag, which a TLS
// upstream rejects as a downgrade; such clients need channel_binding=disable,
// or the upstream leg in plain text on loopback. GSSAPI is not relayed.
// Protocol 3.2's longer cancel keys are avoided by speaking 3.0 upstream.
package pgwire
