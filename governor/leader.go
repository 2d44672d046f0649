package governor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The status detail a standby governord sends with UNAVAILABLE: an
// errdetails.ErrorInfo with this reason and domain, whose metadata names
// the leader's address under standbyLeaderKey (server/ha.go sends it).
const (
	standbyReason    = "STANDBY"
	standbyDomain    = "governor"
	standbyLeaderKey = "leader"
)

// leaderConn is the connection to governord when it runs with standbys:
// one gRPC connection per address, and calls go to the one believed to
// lead. A standby's refusal names the leader, and since a standby did
// nothing the call is sent there at once. Any other UNAVAILABLE (an
// address that cannot be reached, a leader that is stopping) moves the
// next call to the next address, and is returned to the caller, whose
// retries (with backoff, under the same request id) decide what happens.
//
// With one address it behaves as that address's connection, apart from
// following a standby's hint.
//
// It also remembers when a standby last answered. A standby that answers
// while calls fail is one that takes over once the leader's lease runs
// out: governord is between leaders, not gone (Client.unreachable).
type leaderConn struct {
	dial func(addr string) (*grpc.ClientConn, error)

	mu    sync.Mutex
	addrs []string // in the order given, then leaders named by hints
	conns []*grpc.ClientConn
	cur   int

	born    time.Time    // the origin of standby's times, on the monotonic clock
	standby atomic.Int64 // when a standby last answered, as time since born; 0 for never
}

// splitAddrs splits GOVERNOR_ADDR's comma-separated list.
func splitAddrs(list string) ([]string, error) {
	var addrs []string
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, fmt.Errorf("governor: %w: %s=%q has an empty address", ErrInvalidArgument, EnvAddr, list)
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}

func newLeaderConn(addrs []string, dial func(addr string) (*grpc.ClientConn, error)) (*leaderConn, error) {
	l := &leaderConn{dial: dial, born: time.Now()}
	for _, a := range addrs {
		if _, err := l.add(a); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// add connects to addr unless it is known, and returns its index. l.mu is
// held, or l is not yet shared.
func (l *leaderConn) add(addr string) (int, error) {
	for i, a := range l.addrs {
		if a == addr {
			return i, nil
		}
	}
	cc, err := l.dial(addr)
	if err != nil {
		return 0, fmt.Errorf("governor: connect to %s: %w", addr, err)
	}
	l.addrs = append(l.addrs, addr)
	l.conns = append(l.conns, cc)
	return len(l.addrs) - 1, nil
}

func (l *leaderConn) current() (int, *grpc.ClientConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur, l.conns[l.cur]
}

// moveOn makes the next call go to leader when a standby named one, or else
// to the address after failed. It reports whether the call should be sent
// again at once (a standby's refusal: it did nothing).
func (l *leaderConn) moveOn(failed int, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != failed {
		return false // another call moved on already
	}
	if leader := leaderHint(err); leader != "" {
		i, aerr := l.add(leader)
		if aerr == nil && i != failed {
			l.cur = i
			return true
		}
	}
	l.cur = (l.cur + 1) % len(l.conns)
	return false
}

// skip moves the next call on from address from, which answered nothing
// in time, unless another call moved on already (to a leader that
// answers: going back to from would undo it); false when there is only
// one address.
func (l *leaderConn) skip(from int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) < 2 {
		return false
	}
	if l.cur == from {
		l.cur = (from + 1) % len(l.conns)
	}
	return true
}

// maxHints bounds how many standbys' hints one call follows, so that
// standbys that disagree cannot bounce it for ever; the caller's retries
// then take over.
const maxHints = 3

func (l *leaderConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	for hints := 0; ; hints++ {
		i, cc := l.current()
		err := cc.Invoke(ctx, method, args, reply, opts...)
		if status.Code(err) == codes.DeadlineExceeded && ctx.Err() != nil {
			// No answer in the caller's time: a governord that is paused
			// or cut off answers nothing, not even UNAVAILABLE. The next
			// call tries the next address (a standby sends it back here).
			l.moveOn(i, nil)
			return err
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		if isStandby(err) {
			l.standby.Store(int64(max(time.Since(l.born), 1)))
		}
		if !l.moveOn(i, err) || hints >= maxHints {
			return err
		}
	}
}

// standbyAnswered is when a standby last answered a call of l (the zero
// time for never).
func (l *leaderConn) standbyAnswered() time.Time {
	since := l.standby.Load()
	if since == 0 {
		return time.Time{}
	}
	return l.born.Add(time.Duration(since))
}

func (l *leaderConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	i, cc := l.current()
	s, err := cc.NewStream(ctx, desc, method, opts...)
	if status.Code(err) == codes.Unavailable {
		l.moveOn(i, err)
	}
	return s, err
}

// Close closes every connection.
func (l *leaderConn) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, cc := range l.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// leaderHint is the leader's address a standby's UNAVAILABLE names, or "".
func leaderHint(err error) string {
	if info := standbyInfo(err); info != nil {
		return info.Metadata[standbyLeaderKey]
	}
	return ""
}

// isStandby reports whether err is a standby's refusal: a governord that
// is alive, and leads once it wins the election.
func isStandby(err error) bool { return standbyInfo(err) != nil }

// standbyInfo is the detail of a standby's UNAVAILABLE, or nil.
func standbyInfo(err error) *errdetails.ErrorInfo {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == standbyReason && info.Domain == standbyDomain {
			return info
		}
	}
	return nil
}
