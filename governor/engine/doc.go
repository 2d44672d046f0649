// Package engine is Governor's decision core: the governed tree held in memory
// as a pure state machine.
//
// The engine does no I/O and starts no goroutines. Time comes from an injected
// Clock and every change leaves through an injected Sink as an Event, so a
// caller can drive it deterministically, record it, and rebuild it.
//
// # The caller's duties, in order
//
//  1. Build an engine with New, or rebuild one with Restore (a snapshot)
//     followed by Apply (the events after it). Replay runs the same apply code
//     the live path runs, so the rebuilt state is the live state.
//  2. Call operations (OpenSession, Consume, Acquire, Release, ...) from any
//     goroutine. Each takes the engine's one mutex, decides, applies and hands
//     its events to Sink.Emit while still holding the lock. Emit must only
//     queue: it must never block on I/O.
//  3. Before telling a remote caller anything, wait until the store has made
//     every event up to Seq() durable ("write before reply"). The log is then
//     always a prefix of what happened, so no caller is ever ahead of it.
//  4. Call Reap periodically. Expiry is also checked lazily on every touch, so
//     Reap's timing affects only how promptly capacity comes back, never
//     correctness.
//     Reap also closes the windows of quotas with a period (period.go) that
//     are due; DueIn says when the next one is, so a caller that reaps then
//     logs each reset at its boundary even when no call comes. When
//     something may fall due sooner than DueIn last said (a charge starts
//     waiting for a rate), the engine calls Config.Wake: read DueIn again.
//  5. An Acquire that cannot be granted at once returns a *Wait. Receive its
//     outcome, or call CancelWait; a grant that races a cancel is given back.
//
// SPEC.md beside this file states the model and the invariants the tests
// check. This package may import only the standard library.
package engine
