package governor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// A denial on a cap shared with other tenants names no other tenant: the
// consumer is "another tenant", with no id and no use, and the message says
// just that; consumers that are not one node keep their own wording.
func TestDenialMessageOfASharedCap(t *testing.T) {
	base := governor.Denial{Resource: "tokens", NodeID: 1, NodeName: "root", Used: 9, Limit: 10, Amount: 2}
	for _, tt := range []struct {
		name, consumer string
		used           int64
		want           string
	}{
		{"another tenant", "another tenant", 0, `quota exhausted: tokens on "root" (node 1) is 9 of 10, asked 2 more; largest consumer: another tenant`},
		{"reclaimed children", "(ended children, reclaimed)", 9, `quota exhausted: tokens on "root" (node 1) is 9 of 10, asked 2 more; largest consumer "(ended children, reclaimed)" used 9`},
		{"nobody", "", 0, `quota exhausted: tokens on "root" (node 1) is 9 of 10, asked 2 more`},
	} {
		d := base
		d.LargestConsumerName, d.LargestConsumerUsed = tt.consumer, tt.used
		if got := d.Error(); got != tt.want {
			t.Errorf("%s: %q\nwant %q", tt.name, got, tt.want)
		}
	}
}

// Another tenant's node answers NOT_FOUND, as a node that never existed
// does, and Retry gives up on it at once as on any governor refusal.
func TestNotFoundIsNotRetried(t *testing.T) {
	c := dialReal(t)
	_, err := c.Raw().GetNode(t.Context(), &governorpb.GetNodeRequest{NodeId: 1})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetNode of the root: %v, want NotFound", err)
	}
	ctx, _ := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"retry": 10}})
	attempts := 0
	err = governor.Retry(ctx, func(context.Context) error { attempts++; return governor.ErrNotFound },
		governor.WithBackoff(time.Millisecond, time.Millisecond))
	if attempts != 1 || !errors.Is(err, governor.ErrNotFound) {
		t.Fatalf("not found: %d attempts, %v; want 1", attempts, err)
	}
	if strings.Contains(err.Error(), "permission") {
		t.Fatalf("not found reads as a permission error: %v", err)
	}
}
