// Package serverconfig is governord's configuration: the YAML file's private
// shape (fileConfig and the file* types beside it), the validated Config the
// daemon runs with, and their defaults and bounds. It is a leaf apart from
// package server so that a reader of the file (governor doctor) does not
// link the daemon, the stores and the SQLite driver.
//
// The file is read by package configfile, as the sidecar's and the rules
// are. config.go holds the top-level keys, admission.go the admission
// block and each tenant's share of it, caps.go the caps, minimums and
// rates, apirate.go api_rate, ha.go the ha block.
//
// It may import the standard library, internal/configfile,
// internal/apikey, the engine's types (governor/engine, which does no I/O)
// and the generated API's rate parser (api/governorpb); never the server,
// the store or the SDK.
package serverconfig
