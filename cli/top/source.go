// Package top is governor top: a live terminal view of the governed tree,
// built on bubbletea. Model is the screen as a pure state machine (its
// Update and View are tested without a terminal); Source is where the
// figures come from, a governord reached over gRPC (GRPCSource), or a fake
// in tests. It imports the generated API, the SDK and cli/tenantstate,
// never governord.
package top

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/cli/tenantstate"
	"github.com/governor-project/governor/governor"
)

// Source is what the screen reads and the one thing it changes.
type Source interface {
	// Tree lists the subtree the screen shows.
	Tree(ctx context.Context) (*governorpb.ListTreeResponse, error)
	// Inspect lists a node's leases, waiters and recent denials, and
	// governord's figures.
	Inspect(ctx context.Context, node int64) (*governorpb.Inspection, error)
	// SetCap changes one cap through governord's audited path.
	SetCap(ctx context.Context, node int64, limit bool, name string, value int64, reason string) error
	// TenantState reads tenant n's state: why, who set it and since when.
	TenantState(ctx context.Context, n *governorpb.Node) (tenantstate.State, error)
	// CapStatus reads where the caps and rates on a node's chain stand now.
	CapStatus(ctx context.Context, node int64) (*governorpb.CapStatusReport, error)
}

// GRPCSource reads a governord. It dials on first use and again after a
// failure, so the screen keeps working across governord restarts. Safe for
// concurrent use.
type GRPCSource struct {
	// Root is the node to show (0: the key's scope).
	Root int64
	// DialTimeout bounds each attempt to reach governord.
	DialTimeout time.Duration

	mu sync.Mutex
	c  *governor.Client
}

func (s *GRPCSource) client(ctx context.Context) (*governor.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		select {
		case <-s.c.Done(): // the session was lost: open another
			s.c.Close()
			s.c = nil
		default:
			return s.c, nil
		}
	}
	timeout := s.DialTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := governor.Dial(ctx, governor.WithUnavailableRetry(timeout))
	if err != nil {
		return nil, err
	}
	s.c = c
	return c, nil
}

// drop forgets the client after a call failed for want of governord or of
// the session, so the next call dials again.
func (s *GRPCSource) drop(c *governor.Client, err error) {
	switch status.Code(err) {
	case codes.Unavailable, codes.Unauthenticated, codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == c {
		s.c.Close()
		s.c = nil
	}
}

func (s *GRPCSource) root(c *governor.Client) int64 {
	if s.Root != 0 {
		return s.Root
	}
	return c.ScopeID()
}

// Tree implements Source.
func (s *GRPCSource) Tree(ctx context.Context) (*governorpb.ListTreeResponse, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	t, err := c.Raw().ListTree(ctx, &governorpb.ListTreeRequest{NodeId: s.root(c)})
	if err != nil {
		s.drop(c, err)
		return nil, err
	}
	return t, nil
}

// Inspect implements Source.
func (s *GRPCSource) Inspect(ctx context.Context, node int64) (*governorpb.Inspection, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	if node == 0 {
		node = s.root(c)
	}
	in, err := c.Raw().Inspect(ctx, &governorpb.InspectRequest{NodeId: node, Limit: 50})
	if err != nil {
		s.drop(c, err)
		return nil, err
	}
	return in, nil
}

// SetCap implements Source.
func (s *GRPCSource) SetCap(ctx context.Context, node int64, limit bool, name string, value int64, reason string) error {
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	req := &governorpb.SetCapsRequest{NodeId: node, Reason: reason, RequestId: hex.EncodeToString(id[:])}
	if limit {
		req.Limits = map[string]int64{name: value}
	} else {
		req.Quotas = map[string]int64{name: value}
	}
	if _, err := c.Raw().SetCaps(ctx, req); err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	return nil
}

// CapStatus implements Source.
func (s *GRPCSource) CapStatus(ctx context.Context, node int64) (*governorpb.CapStatusReport, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	if node == 0 {
		node = s.root(c)
	}
	rep, err := c.Raw().GetCapStatus(ctx, &governorpb.GetCapStatusRequest{NodeId: node})
	if err != nil {
		s.drop(c, err)
		return nil, err
	}
	return rep, nil
}

// TenantState implements Source.
func (s *GRPCSource) TenantState(ctx context.Context, n *governorpb.Node) (tenantstate.State, error) {
	c, err := s.client(ctx)
	if err != nil {
		return tenantstate.State{}, err
	}
	st, _, err := tenantstate.Of(ctx, c.Raw(), n)
	if err != nil {
		s.drop(c, err)
	}
	return st, err
}

// Close ends the session, if one is open.
func (s *GRPCSource) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		s.c.Close()
		s.c = nil
	}
}
