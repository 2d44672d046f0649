// Package classify holds governor-proxy's classification rules as data: which
// rule an HTTP request or a SQL statement falls under, and so which lease
// class it holds and which quotas it is charged.
//
// It is pure: it does no I/O except reading its rule file (Load) and polling
// it (Watcher). It may import only the standard library, gopkg.in/yaml.v3,
// internal/configfile, internal/filepoll and classify/sqlclass (the kinds of
// statement a rule names are the classifier's); never the proxies, the server,
// the engine or the SDK.
//
// # Rules
//
// The rules live under the rules: key of the proxy's config file. Parse
// reads only that key and ignores every other top-level key, so the proxy
// decodes the rest of the same file itself. ${VAR} references in values are
// expanded after parsing, one value at a time (package configfile, which
// reads the proxy's whole file too).
//
//	rules:
//	  - name: llm                      # required, unique
//	    match: {host: api.openai.com, method: POST, path: /v1/}
//	    class: llm                     # optional: the lease class held while it runs
//	    charge: {llm_calls: 1}         # optional: positive amounts, charged before forwarding
//	    charge_from_header: {resource: tokens, header: x-usage-tokens}
//
// Rules are matched in order and the first match wins. A rule matches only
// the traffic its fields are about: one with HTTP fields never matches a SQL
// statement and one with SQL fields never matches an HTTP request; a rule may
// not mix the two. A rule whose match is empty ({} or no match key) matches
// everything, HTTP and SQL alike, which makes it a catch-all for the end of
// the list. Within a match every field given must match; a field left out
// matches anything.
//
// charge_from_header charges, after the response, the number in a response
// header (HeaderCharge.Amount): a decimal integer >= 0. A missing header or
// any other value charges nothing; the proxy counts and logs it.
//
// bytes: (HTTP rules; Bytes) charges the bytes of request bodies, response
// bodies or both (count: request, response, both) to a resource, chunk
// bytes at most per charge as they stream; result: (SQL rules; Result)
// charges the rows a statement returns to one resource and their bytes to
// another. Each is refused on a rule of the other kind, and bytes on a
// rule that meters.
//
// # HTTP fields
//
//   - host: a name or a glob, e.g. "*.openai.com". Case-insensitive; the
//     request's port and a trailing dot are stripped first. "*" crosses
//     dots, so "*.openai.com" matches "a.b.openai.com" but not "openai.com".
//     IPv6 literals are written with or without brackets.
//   - port: 1-65535. A request without an explicit port has its scheme's
//     default (80, 443); a CONNECT names its port.
//   - scheme: http or https. A CONNECT tunnel has no known scheme, so a rule
//     with scheme never matches one.
//   - method: one method or a list, case-insensitive: GET, HEAD, POST, PUT,
//     PATCH, DELETE, CONNECT, OPTIONS, TRACE.
//   - path: matched against the decoded URL path, without the query, after
//     "." and ".." segments are resolved and repeated slashes folded. It must
//     start with "/". A pattern matches a leading run of whole segments:
//     "/v1" matches /v1, /v1/ and /v1/x but not /v1beta; a trailing slash,
//     "/v1/", requires more after it (/v1/ and /v1/x, not /v1); "/" matches
//     every path. Within a segment, "*" matches any run of characters but
//     never "/", so "/v1/*/completions" matches /v1/chat/completions (and
//     /v1/chat/completions/x) but not /v1/a/b/completions; a segment that is
//     exactly "**" matches any number of whole segments, none included. A
//     CONNECT tunnel has no known path, so a rule with path never matches
//     one: for tunnels, match on host and port.
//   - header: a map of header name to value glob, case-sensitive in the
//     value. The request must carry the header with a matching value; when
//     it repeats, any value may match. "*" requires only that it is present.
//
// # SQL fields
//
//   - sql: one statement kind or a list (select, insert, update, delete,
//     merge, copy, truncate, lock, call, do, function, ddl, transaction,
//     utility, unknown), or any. Each statement of a message is matched on
//     its own. A statement can have several kinds (a data-modifying WITH,
//     a SELECT that calls a function); the rule matches when they share
//     one. function is a call of a function not known to only read; unknown
//     is a statement the classifier could not see into (past its limits, or
//     an EXECUTE of a name it did not see prepared), which names no table:
//     only rules that name unknown, sql: any, and rules without sql and
//     tables match it.
//   - tables: globs, case-insensitive; matches when any table the statement
//     names matches any of them. A pattern with a "." (public.pay*) is
//     matched against the name as the statement gives it; one without
//     (pay*), against the part after the schema. A statement that names no
//     table never matches a rule with tables.
//   - database, user, application_name: globs, case-sensitive, matched
//     against the values of the connection's startup message.
//
// # Globs
//
// "*" matches any run of characters, "?" one character, "[a-z]" one
// character of a set ("[!a-z]" or "[^a-z]" negates; sets are ASCII only) and
// "\" escapes the next character. A glob matches the whole value. A pattern
// without these characters is an exact match (for path, the prefix match
// above).
//
// # Errors
//
// A rule file is loaded all or nothing: the first problem found rejects it
// with an *Error that names the key and the rule by name, e.g.
//
//	config: rules[2].match.method (rule "writes"): "FETCH" is not an HTTP method
//
// The file is read as governord's and the rest of the sidecar's are
// (package configfile): an unknown key (keys match case and all) or a key
// given twice is an error; a key with no value is absent; merge keys work.
// So are a missing or duplicate name, a bad glob, a charge that is not
// positive, an empty class, an unknown statement kind, a port out of range
// and a match that mixes HTTP and SQL fields.
//
// # Reloading
//
// A Watcher polls the file by content hash, which follows a Kubernetes
// ConfigMap's symlink swap, applies a change that has settled, keeps the old
// rules when the new file fails to load, and reports each outcome to a
// callback. Rules values are immutable; the Watcher swaps an atomic pointer,
// so a request in flight keeps the rules it started with and no open
// connection is dropped by a reload.
package classify
