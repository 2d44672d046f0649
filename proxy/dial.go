package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
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
// link-local or metadata address, or at the proxy, is refused too (and a
// second lookup cannot change the answer between the check and the dial).
type dialer struct {
	resolver       Resolver
	allowLinkLocal bool
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
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("bad port in %q", addr)
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	ips, err := d.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	var refused error
	var nd net.Dialer
	var lastErr error
	for _, ip := range ips {
		if err := d.check(ip, uint16(port)); err != nil {
			refused = err
			continue
		}
		c, err := nd.DialContext(ctx, network, netip.AddrPortFrom(ip, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	if lastErr != nil {
		return nil, lastErr
	}
	if refused != nil {
		return nil, refused
	}
	return nil, fmt.Errorf("%s has no address", host)
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

// check refuses link-local and metadata addresses (unless allowed) and the
// proxy's own listeners.
func (d *dialer) check(ip netip.Addr, port uint16) error {
	ip = ip.Unmap()
	if !d.allowLinkLocal && (ip.IsLinkLocalUnicast() || ip == metadataV6) {
		return &refusal{code: http.StatusForbidden, reason: "Forbidden link-local destination",
			err: fmt.Errorf("%s is a link-local or metadata address; set http.allow_link_local: true to allow it", ip)}
	}
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
			return &refusal{code: http.StatusLoopDetected, reason: "Loop Detected",
				err: fmt.Errorf("%s is governor-proxy itself; a proxy does not proxy to itself", netip.AddrPortFrom(ip, port))}
		}
	}
	return nil
}

// refuseLiteral checks a target given as an IP literal before anything is
// charged for it. Names are checked when they are dialed.
func (d *dialer) refuseLiteral(hostport, defaultPort string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, defaultPort
	}
	ip, err := netip.ParseAddr(trimBrackets(host))
	if err != nil {
		return nil
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil
	}
	return d.check(ip, uint16(p))
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
