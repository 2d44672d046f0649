// Package governor is the Go SDK for governord: it lets a program ask, before
// each piece of work, whether the work may proceed given the task that spawned
// it, the tenant that owns it and the pools every tenant shares.
//
// # Using it
//
// Dial opens a session with governord and keeps it alive with heartbeats.
// NewTask creates a node in the tree and returns a context that carries it, so
// code deep in the call stack is governed without a handle to the task:
//
//	client, err := governor.Dial(ctx)
//	...
//	defer client.Close()
//	ctx, task, err := client.NewTask(ctx, governor.Spec{
//		Name:   "crawl-site",
//		Quotas: map[string]int64{"http": 500, "retry": 20},
//	})
//	...
//	defer task.Close()
//	httpClient := &http.Client{Transport: governor.Transport(nil)}
//
// Transport, NewGroup and Retry take the task from the context they are given.
// Without one they return an error: they never run work ungoverned.
//
// # Failing closed
//
// Every lease belongs to the session. The client gives the session up at 80%
// of its TTL after the last heartbeat that succeeded, measured from when that
// heartbeat was sent, which is always earlier than the server's own expiry.
// From then on Client.Done is closed, every task context from the client is
// cancelled, and every call returns an error wrapping ErrSessionLost. A
// client cannot recover a lost session: Dial again.
//
// # Errors and retries
//
// Calls that fail at the server return a *StatusError, which carries the gRPC
// status (status.FromError works on it) and unwraps to one of the sentinel
// errors in errors.go, or to a *Denial, *LeaseEndedError or *TaskEndedError
// with the details the server sent. CauseOf says why a call was refused,
// as governord named it (a Cause: quota, rate, task-ended, suspended,
// read-only, bound), by the word the sidecar's Governor-Denied header
// uses; the sentinel of a refusal with no typed detail follows from its
// cause (cause.go). Every call that changes state carries a
// fresh random request id, and a call that fails with UNAVAILABLE is retried
// with the same id, so a lost reply never charges twice.
//
// A call that grants (Acquire, ChargeAndAcquire, and ResizeBlock and Reserve
// when they ask for more) and fails without an answer (its context ended,
// or governord stayed unreachable) may have been granted anyway. The client
// then abandons its request id: it sends the same request again marked as
// abandoned, and governord gives back whatever it granted, so that nothing
// is held that nobody knows of. When governord was reachable the call
// returns once that is done; otherwise it goes on in the background.
//
// A rate that refuses a charge is a *RateLimitedError carrying the wait,
// at once; Retry waits it out. A charge made with WaitForRate waits for
// the rate at governord instead, until its context ends: governord grants
// waiting charges in weighted round robin across tenants, so that a
// contended rate is shared by weight rather than by who retries first.
//
// # Imports
//
// This package may import only the standard library, gRPC, protobuf,
// api/governorpb and internal/retry. It must not import the engine or the server: it speaks to
// governord only through its API.
package governor
