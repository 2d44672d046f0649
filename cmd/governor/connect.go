package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// dialTimeout bounds how long a command waits for governord before it says
// it cannot be reached.
const dialTimeout = 10 * time.Second

// connect opens a session with governord from the environment the SDK
// reads (GOVERNOR_ADDR, GOVERNOR_API_KEY, GOVERNOR_TLS, GOVERNOR_CA_FILE).
func connect(ctx context.Context) (*governor.Client, error) {
	return connectWithin(ctx, dialTimeout)
}

// connectWithin is connect, giving up after timeout.
func connectWithin(ctx context.Context, timeout time.Duration) (*governor.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := governor.Dial(ctx, governor.WithUnavailableRetry(timeout))
	if err != nil {
		return nil, fmt.Errorf("connect to governord: %w", err)
	}
	return c, nil
}

// rootID is the root's id, which the API fixes (Node.id).
const rootID = 1

// resolve finds a node by id ("7") or by path from the root
// ("payments/checkout-42"); "/", as the commands print the root, is the
// root.
func resolve(ctx context.Context, rpc governorpb.GovernorClient, ref string) (*governorpb.Node, error) {
	req := &governorpb.GetNodeRequest{Path: ref}
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		req = &governorpb.GetNodeRequest{NodeId: id}
	} else if strings.Trim(ref, "/") == "" && ref != "" {
		req = &governorpb.GetNodeRequest{NodeId: rootID}
	}
	n, err := rpc.GetNode(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", ref, plainStatus(err))
	}
	return n, nil
}

// pathOf names a node by its path from the root, as far up as the session
// can see (a tenant's key sees its own tenant and below).
func pathOf(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node) (string, []*governorpb.Node) {
	chain := []*governorpb.Node{n}
	for p := n.GetParentId(); p != 0; {
		parent, err := rpc.GetNode(ctx, &governorpb.GetNodeRequest{NodeId: p})
		if err != nil {
			break // above the scope
		}
		chain = append(chain, parent)
		p = parent.GetParentId()
	}
	var names []string
	for i := len(chain) - 1; i >= 0; i-- {
		if chain[i].GetParentId() == 0 {
			continue // the root is not part of a path
		}
		names = append(names, chain[i].GetName())
	}
	if len(names) == 0 {
		return "/", chain
	}
	return strings.Join(names, "/"), chain
}

// plainStatus turns a gRPC status into an error that reads as a sentence.
func plainStatus(err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.OK {
		return fmt.Errorf("%s (%s)", st.Message(), codeWords(st.Code()))
	}
	return err
}

// codeWords spells a status code as words: NotFound is "not found".
func codeWords(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte(' ')
		}
		b.WriteRune(r)
	}
	return strings.ToLower(b.String())
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// parseInterleaved parses fs's flags wherever they stand among the
// positional arguments (governor caps set NODE k=v --reason x), and
// returns the positional ones in order.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

var errUsage = errors.New("usage")

// flagSet reports whether the flag name was given on the command line, as
// opposed to left at its default.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
