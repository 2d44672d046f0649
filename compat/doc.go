// Package compat is the client compatibility matrix: its tests drive real,
// unmodified clients, as a fleet runs them, through governor-proxy.
//
//   - drivers_test.go: PostgreSQL drivers (psycopg2, psycopg 3, node-postgres's
//     Client and Pool, the PostgreSQL JDBC driver, lib/pq) through the pgwire
//     listener, each against a direct connection in the same run.
//   - libpq_test.go: lib/pq's cells, in Go through database/sql, as a Go
//     program uses it.
//   - http_test.go: HTTP clients (curl, Python's requests and urllib, Node's
//     fetch through undici and axios, Java's HttpClient, Go's net/http) through
//     the forward proxy, each reading the proxy the way it does in production.
//   - intercept_test.go: HTTPS clients (curl, requests, undici, axios, Java's
//     HttpClient, Go's net/http) through an intercepted tunnel, each
//     trusting the sidecar's CA as it does in production, under a quota of 5
//     requests over keep-alive; and clients given no CA, which must refuse
//     it.
//   - matrix_test.go: the results, written to docs/compatibility.md with
//     GOVERNOR_COMPAT_WRITE=1 and otherwise compared with it.
//
// The clients' own code lives in python/, node/ (with its package-lock.json)
// and java/. The tests skip unless GOVERNOR_COMPAT is set: scripts/compat.sh
// installs the clients (apt-get, npm ci), starts PostgreSQL and sets it, and
// ./test.sh runs that script on a full run. The package has no code of its
// own besides its tests, and imports the sidecar and internal test helpers
// only.
package compat
