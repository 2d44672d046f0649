package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/governor-project/governor/cli/top"
	"github.com/governor-project/governor/governor"
)

const topUsage = `usage: governor top [-root NODE] [-refresh 1s]   (also: governor ui)

A live view of the tree: per node its quotas (used/cap, with a bar), limits
(held/limit), queued acquires and age; the selected node's leases and
recent denials below; leases, waiters, commit latency and the events rate
on top. Keys: arrows/pgup/pgdn move, s sorts by use, / filters by name,
e edits a cap (with a reason, through the audited path of governor caps),
r refreshes, q quits. An admin key sees the whole tree, a tenant's key its
own subtree.

flags:
`

func topCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, topUsage); fs.PrintDefaults() }
	rootRef := fs.String("root", "", "the node to show (id or path); default the key's scope")
	refresh := fs.Duration("refresh", top.DefaultRefresh, "how often to refresh (at most 1s is useful)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *refresh <= 0 {
		fmt.Fprintln(stderr, "governor top: no arguments; -refresh is positive")
		return 2
	}
	src := &top.GRPCSource{DialTimeout: 2 * time.Second}
	defer src.Close()
	if *rootRef != "" {
		c, err := connect(context.Background())
		if err != nil {
			fmt.Fprintln(stderr, "governor top:", err)
			return 1
		}
		n, err := resolve(context.Background(), c.Raw(), *rootRef)
		c.Close()
		if err != nil {
			fmt.Fprintln(stderr, "governor top:", err)
			return 1
		}
		src.Root = n.GetId()
	}
	addr := os.Getenv(governor.EnvAddr)
	if addr == "" {
		addr = governor.DefaultAddr
	}
	p := tea.NewProgram(top.New(src, addr, *refresh), tea.WithAltScreen(), tea.WithOutput(stdout))
	if _, err := p.Run(); err != nil {
		fmt.Fprintln(stderr, "governor top:", err)
		return 1
	}
	return 0
}
