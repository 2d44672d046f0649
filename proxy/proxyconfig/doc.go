// Package proxyconfig is governor-proxy's configuration: the YAML file's
// private shape (fileConfig), the validated Config the sidecar runs with,
// and their defaults. It is a leaf apart from package proxy so that a
// reader of the file (governor explain, governor doctor) does not link the
// sidecar.
//
// The file is read by package configfile, as governord's and the rules are;
// the rules: key is compiled by package classify.
//
// It may import the standard library, yaml.v3, internal/configfile,
// classify, the SDK's constants (package governor) and the sidecar's
// packages whose types its Config carries (httpproxy, intercept, budget);
// never package proxy, pgwire (the wire proxy), the server or the store.
package proxyconfig
