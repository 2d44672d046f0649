package budget

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/governor"
)

// governord charges a block's slots whole and cannot see which of them
// hold work; the session tells it (ReportBlockUse) how many do and since
// when the one held longest has, so that governor doctor and top tell a
// stuck request or transaction from idle slots. A report goes when that
// changes, at most every useEvery, and again every useRefresh, since
// governord forgets reports when it restarts.
const (
	useEvery   = time.Second
	useRefresh = 15 * time.Second
)

// blockUse is one block's use as reported: since is when the work held
// longest took its slot.
type blockUse struct {
	node  int64
	class string
	inUse int64
	since time.Time
}

// useReporter is what the session last told governord of its blocks.
type useReporter struct {
	mu      sync.Mutex
	last    []blockUse
	lastAt  time.Time
	sending bool
	off     bool // governord does not take reports: it is older than this sidecar
}

// blocksInUse lists the session's blocks with slots holding work, in a
// fixed order.
func (s *session) blocksInUse() []blockUse {
	var out []blockUse
	s.each(func(n *node) {
		pools, _ := n.holdings()
		for _, p := range pools {
			if k, since := p.use(); k > 0 {
				out = append(out, blockUse{node: n.t.ID(), class: p.class, inUse: k, since: since})
			}
		}
	})
	slices.SortFunc(out, func(a, b blockUse) int {
		return cmp.Or(cmp.Compare(a.node, b.node), strings.Compare(a.class, b.class))
	})
	return out
}

// reportUse tells governord how the session's blocks are used, in the
// background, when that changed since the last report (or it is due again).
func (s *session) reportUse(now time.Time) {
	cur := s.blocksInUse()
	r := &s.use
	r.mu.Lock()
	defer r.mu.Unlock()
	due := now.Sub(r.lastAt) >= useRefresh || now.Sub(r.lastAt) >= useEvery && !slices.Equal(cur, r.last)
	if r.off || r.sending || !due {
		return
	}
	r.sending = true
	s.a.bg.Go(func() {
		use := make([]governor.BlockUse, len(cur))
		for i, u := range cur {
			use[i] = governor.BlockUse{Node: u.node, Class: u.class, InUse: u.inUse, Oldest: now.Sub(u.since)}
		}
		ctx, cancel := context.WithTimeout(s.life, callTimeout)
		defer cancel()
		err := s.client.ReportBlockUse(ctx, use)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.sending = false
		switch {
		case err == nil:
			r.last, r.lastAt = cur, now
		case status.Code(err) == codes.Unimplemented:
			r.off = true
			s.a.log.Info("governor-proxy: governord does not take reports of how delegated slots are used (it is older); governor doctor and top cannot tell idle slots from stuck work", "err", err)
		default:
			s.a.log.Debug("governor-proxy: reporting how delegated slots are used failed; the next tick tries again", "err", err)
		}
	})
}
