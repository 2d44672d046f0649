package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/governor-project/governor/api/governorpb"
)

const tenantUsage = `usage:
  governor tenant NAME suspend|resume|read-only|close -reason "why" [-revoke]

suspend    no new work at all for the tenant (403 / SQLSTATE 53400 suspended);
           queued acquires fail; running leases are left alone unless -revoke
read-only  no new writes (HTTP methods other than GET, HEAD, OPTIONS unless a
           rule says read; SQL that may write): 403 / SQLSTATE 25006 read-only
close      no new tasks; what runs finishes
resume     active again

It needs the admin key (GOVERNOR_API_KEY). Every change is kept in the
tenant's audit trail (governor caps history NAME) with who and why, and
survives restarts.
`

// tenantStates maps the command's words to governord's states.
var tenantStates = map[string]string{"suspend": "suspended", "resume": "active", "read-only": "read_only", "close": "closing"}

func tenantCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor tenant", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, tenantUsage); fs.PrintDefaults() }
	reason := fs.String("reason", "", "why (required; kept in the audit trail)")
	revoke := fs.Bool("revoke", false, "also end the tenant's running leases at once")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 2 {
		fs.Usage()
		return 2
	}
	state, ok := tenantStates[pos[1]]
	switch {
	case !ok:
		fmt.Fprintf(stderr, "governor tenant: %q is not suspend, resume, read-only or close\n\n%s", pos[1], tenantUsage)
		return 2
	case strings.TrimSpace(*reason) == "":
		fmt.Fprintln(stderr, "governor tenant: -reason is required: say why, it is kept in the audit trail")
		return 2
	}
	ctx := context.Background()
	c, err := connect(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "governor tenant:", err)
		return 1
	}
	defer c.Close()
	n, err := resolve(ctx, c.Raw(), pos[0])
	if err == nil {
		var after *governorpb.Node
		after, err = c.Raw().SetTenantState(ctx, &governorpb.SetTenantStateRequest{RequestId: newRequestID(), NodeId: n.GetId(),
			State: state, Reason: *reason, Revoke: *revoke})
		if err == nil {
			fmt.Fprintf(stdout, "%s: %s -> %s\n", n.GetName(), n.GetTenantState(), after.GetTenantState())
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "governor tenant:", plainStatus(err))
		return 1
	}
	return 0
}
