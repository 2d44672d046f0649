// Package governorpb holds the generated Go types and gRPC client and server
// stubs for governord's API (package governor.v1), defined in governor.proto
// next to this file.
//
// The .pb.go files are generated and committed, so building needs no protoc.
// After editing governor.proto, regenerate them with scripts/genproto.sh, and
// check that they are current with scripts/genproto.sh --check.
//
// Every call except OpenSession carries the session token in gRPC metadata as
// "authorization: Bearer <token>". Errors use standard gRPC status codes;
// RESOURCE_EXHAUSTED carries a *Denial, *RateLimited or *BoundReached
// detail and FAILED_PRECONDITION a *NodeEnded, *TenantRefusal or
// *LeaseEnded detail (see the service comment in the .proto). Each detail
// of a refusal of work says why in its Cause (cause.go names each cause on
// the wire).
package governorpb
