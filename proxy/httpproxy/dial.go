package httpproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Resolver looks up the addresses of a host name. *net.Resolver satisfies
// it; tests give names of their own.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// metadataV6 is the AWS instance metadata service's IPv6 address; the IPv4
// one, 169.254.169.254, is link-local like the rest of 169.254.0.0/16.
var metadataV6 = netip.MustParseAddr("fd00:ec2::254")

// dialer connects to upstreams, for plain HTTP and for CONNECT alike. It
// never reads HTTP_PROXY or HTTPS_PROXY: a sidecar that inherits the
// worker's environment would otherwise proxy to itself. It resolves names
// itself and dials the addresses it checked, so a name that points at a
// refused address (the proxy, governord, loopback, link-local or metadata)
// is refused too, and a second lookup cannot change the answer between the
// check and the dial.
type dialer struct {
	resolver       Resolver
	allowLinkLocal bool
	allow          []Target
	governord      *governordAddrs
	timeout        time.Duration

	mu   sync.RWMutex
	self []netip.AddrPort // the proxy's own listeners, once bound
}

func (d *dialer) addSelf(addr net.Addr) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return
	}
	d.mu.Lock()
	d.self = append(d.self, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	d.mu.Unlock()
}

// DialContext dials addr ("host:port") over TCP.
func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	t, err := d.lookup(ctx, addr)
	if err != nil {
		return nil, err
	}
	return d.dialTarget(ctx, network, t)
}

// target is an upstream whose addresses have been resolved and checked.
type target struct {
	host    string
	port    uint16
	ips     []netip.Addr // the addresses that passed check
	refused error        // why the others did not, if any
}

// lookup resolves addr ("host:port") and checks every address. It fails
// when no address may be dialed: the error is then the dialer's *refusal
// for one of them, or the lookup's own error.
func (d *dialer) lookup(ctx context.Context, addr string) (target, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return target{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return target{}, fmt.Errorf("bad port in %q", addr)
	}
	ips, err := d.resolve(ctx, host)
	if err != nil {
		return target{}, err
	}
	gov := d.governord.get(ctx, d.resolver)
	t := target{host: host, port: uint16(port)}
	for _, ip := range ips {
		if err := d.check(ip, t.port, gov); err != nil {
			t.refused = err
			continue
		}
		t.ips = append(t.ips, ip)
	}
	if len(t.ips) == 0 {
		if t.refused != nil {
			return target{}, t.refused
		}
		return target{}, fmt.Errorf("%s has no address", host)
	}
	return t, nil
}

// lookupTimeout is lookup bounded by the dial timeout.
func (d *dialer) lookupTimeout(ctx context.Context, addr string) (target, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	return d.lookup(ctx, addr)
}

// dialTarget dials the checked addresses of t in turn; it does not look
// the name up again, so what was checked is what is dialed.
func (d *dialer) dialTarget(ctx context.Context, network string, t target) (net.Conn, error) {
	var nd net.Dialer
	var lastErr error
	for _, ip := range t.ips {
		c, err := nd.DialContext(ctx, network, netip.AddrPortFrom(ip, t.port).String())
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	if lastErr != nil {
		return nil, lastErr
	}
	if t.refused != nil {
		return nil, t.refused
	}
	return nil, fmt.Errorf("%s has no address", t.host)
}

func (d *dialer) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(trimBrackets(host)); err == nil {
		return []netip.Addr{ip.Unmap()}, nil
	}
	ips, err := d.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	return ips, nil
}

// check refuses, in order: the proxy's own listeners (always), governord
// (unless an http.allow_targets entry names its port), then, unless an
// entry covers the address, link-local and metadata addresses (unless
// http.allow_link_local) and loopback ones, 0.0.0.0 and :: among them.
func (d *dialer) check(ip netip.Addr, port uint16, gov []netip.AddrPort) error {
	ip = ip.Unmap()
	if err := d.checkSelf(ip, port); err != nil {
		return err
	}
	ap := netip.AddrPortFrom(ip, port)
	if isGovernord(gov, ip, port) && !d.allowed(ip, port, true) {
		return forbidden("Forbidden governord destination",
			"%s is governord; a worker reaches it through its own session, not through the proxy (an http.allow_targets entry with this port allows it)", ap)
	}
	if d.allowed(ip, port, false) {
		return nil
	}
	if !d.allowLinkLocal && (ip.IsLinkLocalUnicast() || ip == metadataV6) {
		return forbidden("Forbidden link-local destination",
			"%s is a link-local or metadata address; set http.allow_link_local: true, or list it in http.allow_targets, to allow it", ip)
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return forbidden("Forbidden loopback destination",
			"%s is a loopback address, this host's own services; list it in http.allow_targets (e.g. %s) to allow it", ap, ap)
	}
	return nil
}

// allowed reports whether an http.allow_targets entry covers ip:port; with
// portNamed, only an entry that names the port counts.
func (d *dialer) allowed(ip netip.Addr, port uint16, portNamed bool) bool {
	for _, t := range d.allow {
		if t.covers(ip, port) && (!portNamed || t.Port != 0) {
			return true
		}
	}
	return false
}

// forbidden is the refusal of a target the proxy will not reach: 403 with
// Governor-Denied: forbidden-target.
func forbidden(reason, format string, args ...any) *refusal {
	return &refusal{code: http.StatusForbidden, reason: reason, cause: causeForbiddenTarget, err: fmt.Errorf(format, args...)}
}

// checkSelf refuses the proxy's own listeners: a proxy does not proxy to
// itself.
func (d *dialer) checkSelf(ip netip.Addr, port uint16) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, s := range d.self {
		if s.Port() != port {
			continue
		}
		same := ip == s.Addr() ||
			// 0.0.0.0 and :: reach the local host, and a listener on them
			// answers on every local address.
			(ip.IsUnspecified() && (s.Addr().IsLoopback() || s.Addr().IsUnspecified())) ||
			(s.Addr().IsUnspecified() && (ip.IsLoopback() || isLocalAddr(ip)))
		if same {
			return &refusal{code: http.StatusLoopDetected, reason: "Loop Detected", cause: causeForbiddenTarget,
				err: fmt.Errorf("%s is governor-proxy itself; a proxy does not proxy to itself", netip.AddrPortFrom(ip, port))}
		}
	}
	return nil
}

// refuseLiteral checks a target given as an IP literal, or as localhost,
// before anything is charged for it: neither needs a lookup. Other names
// are checked when they are resolved (a CONNECT before it is charged, a
// plain request when its transport dials).
func (d *dialer) refuseLiteral(ctx context.Context, hostport, defaultPort string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, defaultPort
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil
	}
	ips := loopbacks
	if ip, err := netip.ParseAddr(trimBrackets(host)); err == nil {
		ips = []netip.Addr{ip}
	} else if !isLocalhost(host) {
		return nil
	}
	gov := d.governord.get(ctx, d.resolver)
	for _, ip := range ips {
		if err := d.check(ip, uint16(p), gov); err != nil {
			return err
		}
	}
	return nil
}

// loopbacks are the addresses localhost stands for.
var loopbacks = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}

// isLocalhost reports whether host is the name localhost (any case, with
// or without the root's dot), which names this host whatever a resolver
// says (RFC 6761).
func isLocalhost(host string) bool {
	return strings.EqualFold(strings.TrimSuffix(host, "."), "localhost")
}

func trimBrackets(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}

// isLocalAddr reports whether ip is one of this host's interface addresses.
func isLocalAddr(ip netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == ip {
			return true
		}
	}
	return false
}

// outcome is how a request the upstream failed is counted: the client left,
// the upstream timed out or failed, or the proxy refused the target.
func (r *refusal) outcome(req *http.Request) string {
	switch {
	case req.Context().Err() != nil:
		return outcomeCanceled
	case r.code == http.StatusGatewayTimeout:
		return outcomeTimeout
	case r.code != http.StatusBadGateway:
		return outcomeRefused
	}
	return outcomeUpstreamError
}

// upstreamRefusal turns an error reaching the upstream into the proxy's
// answer: 504 when it timed out, 502 otherwise, or the dialer's own
// refusal.
func upstreamRefusal(err error) *refusal {
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return &refusal{code: http.StatusGatewayTimeout, reason: "Gateway Timeout", err: fmt.Errorf("upstream timed out: %w", err)}
	}
	return &refusal{code: http.StatusBadGateway, reason: "Bad Gateway", err: fmt.Errorf("upstream failed: %w", err)}
}
