package classify

import "fmt"

// Bytes asks the proxy to charge the bytes an HTTP rule's traffic carries
// to a resource of the operator's naming: a request's body, a response's
// body, or both, and for a CONNECT tunnel that is not intercepted, the
// tunnel's bytes (request: client to upstream; response: upstream to
// client).
//
//	bytes: {resource: egress_bytes, count: response, chunk: 65536}
type Bytes struct {
	Resource string
	// Request and Response say which directions count (count: request,
	// response or both, the default).
	Request, Response bool
	// Chunk is the most one charge takes while a body streams, so that
	// governord is called about once a chunk, not once a read. The proxy
	// takes less when a rate's bucket cannot hold it. Default
	// DefaultBytesChunk.
	Chunk int64
}

// Result asks the PostgreSQL side to charge what a SQL rule's statements
// return, as the server sends it: the rows (DataRow messages) to one
// resource, their bytes to another.
//
//	result: {rows: rows_read, bytes: result_bytes}
type Result struct {
	Rows  string // "" counts no rows
	Bytes string // "" counts no bytes
}

// Defaults and bounds of the bytes: and result: keys.
const (
	DefaultBytesChunk = 64 << 10
	// MaxBytesChunk is the largest chunk: 64 MiB, past which one charge
	// would hold back a whole large body's worth of a quota at once.
	MaxBytesChunk = 64 << 20
)

type fileBytes struct {
	Resource *string  `yaml:"resource"`
	Count    *string  `yaml:"count"`
	Chunk    *integer `yaml:"chunk"`
}

type fileResult struct {
	Rows  *string `yaml:"rows"`
	Bytes *string `yaml:"bytes"`
}

// compileBytes reads a rule's bytes: key.
func compileBytes(fb *fileBytes) (*Bytes, error) {
	if fb.Resource == nil {
		return nil, fieldErr("bytes.resource", "is missing: name the resource the bytes are charged to, e.g. egress_bytes")
	}
	if err := checkName(*fb.Resource); err != nil {
		return nil, fieldErr("bytes.resource", "%v", err)
	}
	b := &Bytes{Resource: *fb.Resource, Request: true, Response: true, Chunk: DefaultBytesChunk}
	if fb.Count != nil {
		switch *fb.Count {
		case "both":
		case "request":
			b.Response = false
		case "response":
			b.Request = false
		default:
			return nil, fieldErr("bytes.count", "%q is not request, response or both", *fb.Count)
		}
	}
	if fb.Chunk != nil {
		if *fb.Chunk < 1 || *fb.Chunk > MaxBytesChunk {
			return nil, fieldErr("bytes.chunk", "%d is not from 1 to %d", *fb.Chunk, MaxBytesChunk)
		}
		b.Chunk = int64(*fb.Chunk)
	}
	return b, nil
}

// compileResult reads a rule's result: key.
func compileResult(fr *fileResult) (*Result, error) {
	var r Result
	for _, f := range []struct {
		key string
		v   *string
		dst *string
	}{{"rows", fr.Rows, &r.Rows}, {"bytes", fr.Bytes, &r.Bytes}} {
		if f.v == nil {
			continue
		}
		if err := checkName(*f.v); err != nil {
			return nil, fieldErr("result."+f.key, "%v", err)
		}
		*f.dst = *f.v
	}
	switch {
	case r.Rows == "" && r.Bytes == "":
		return nil, fieldErr("result", "names no resource: give rows, bytes or both")
	case r.Rows == r.Bytes:
		return nil, fieldErr("result", "rows and bytes are both charged to %s; name two resources, or leave one out", r.Rows)
	}
	return &r, nil
}

// compileTraffic reads the bytes: and result: keys, once the rule's kind
// is known: bytes is for HTTP traffic and result for SQL.
func compileTraffic(r *rule, fr *fileRule) error {
	if fr.Bytes != nil {
		if r.kind == kindSQL {
			return fieldErr("bytes", "is for HTTP rules; a SQL rule charges what its statements return with result")
		}
		if r.decision.Meter != nil {
			return fieldErr("bytes", "a rule meters LLM tokens or charges bytes, not both")
		}
		b, err := compileBytes(fr.Bytes)
		if err != nil {
			return err
		}
		r.decision.Bytes = b
	}
	if fr.Result != nil {
		if r.kind == kindHTTP {
			return fieldErr("result", "is for SQL rules; an HTTP rule charges its bytes with bytes")
		}
		res, err := compileResult(fr.Result)
		if err != nil {
			return err
		}
		r.decision.Result = res
	}
	return nil
}

func (b *Bytes) String() string {
	dir := "request and response bodies (a tunnel's both ways"
	switch {
	case !b.Response:
		dir = "request bodies (what a tunnel's client sends"
	case !b.Request:
		dir = "response bodies (what a tunnel's upstream sends"
	}
	return fmt.Sprintf("charge the bytes of %s, when not intercepted) to %s, up to %d a charge as they stream", dir, b.Resource, b.Chunk)
}

func (r *Result) String() string {
	switch {
	case r.Bytes == "":
		return fmt.Sprintf("charge the rows a statement returns to %s", r.Rows)
	case r.Rows == "":
		return fmt.Sprintf("charge the bytes of the rows a statement returns to %s", r.Bytes)
	}
	return fmt.Sprintf("charge the rows a statement returns to %s and their bytes to %s", r.Rows, r.Bytes)
}
