package admission

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/governor-project/governor/governor"
)

// A refusal governord answered (permission denied, not found) fails closed
// as unavailable, as the table of denials has no other cause for it, but
// its message says governord refused the call: "cannot be reached" would
// send the operator to the network instead of the sidecar's key or task.
func TestUnavailableSaysWhetherGovernordAnswered(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: node 7 is outside the session's scope", governor.ErrPermissionDenied), "governord refused the sidecar's call (permission denied: node 7 is outside the session's scope)"},
		{fmt.Errorf("%w: no node 9", governor.ErrNotFound), "governord refused the sidecar's call (not found: no node 9)"},
		{fmt.Errorf("%w: connection refused", governor.ErrUnavailable), "governord cannot be reached"},
	} {
		d := Deny(ctx, c.err, "", 0)
		if d.Cause != CauseUnavailable || !strings.Contains(d.Message(), c.want) {
			t.Errorf("%v: cause %v, message %q; want unavailable saying %q", c.err, d.Cause, d.Message(), c.want)
		}
	}
}
