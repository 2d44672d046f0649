// Package intercept is what governor-proxy needs to terminate the TLS of
// CONNECT tunnels to the hosts an operator lists (http.intercept), so that
// every request inside them is governed as plain HTTP is: which hosts are
// listed (Hosts), the pod-local certificate authority (CA: loaded from PEM
// files and checked, or made anew by NewCA for `governor ca create`), and
// the leaf certificates minted from it per host on first use (Minter:
// cached within a bound, minted once however many first requests arrive
// together, renewed before they expire). Watch keeps the CA current as its
// files change.
//
// It does no network I/O. It may import the standard library and
// internal/filepoll only.
//
// # Files
//
//   - hosts.go: the listed hosts (names, *.suffix wildcards, IP literals).
//   - ca.go: loading and checking a CA; NewCA with name constraints.
//   - leaf.go: the Minter and its cache.
//   - watch.go: reloading the CA files.
package intercept
