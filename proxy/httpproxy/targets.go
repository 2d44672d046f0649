package httpproxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Target is an entry of Config.AllowTargets: the addresses of a prefix, on
// one port or on any.
type Target struct {
	Prefix netip.Prefix
	Port   uint16 // 0: any port
}

func (t Target) covers(ip netip.Addr, port uint16) bool {
	return t.Prefix.Contains(ip) && (t.Port == 0 || t.Port == port)
}

func (t Target) String() string {
	s := t.Prefix.String()
	if t.Prefix.IsSingleIP() {
		s = t.Prefix.Addr().String()
	}
	if t.Port == 0 {
		return s
	}
	return net.JoinHostPort(s, strconv.Itoa(int(t.Port)))
}

// ParseTarget reads an http.allow_targets entry: an address ("127.0.0.1",
// "::1"), a prefix ("127.0.0.0/8", "fd00::/8"), either with a port
// ("127.0.0.1:8080", "[::1]:8080"), or "localhost" with or without a port,
// which stands for 127.0.0.0/8 and ::1. Without a port, every port is
// allowed except governord's: only an entry with governord's port allows
// that.
func ParseTarget(s string) ([]Target, error) {
	host, port := s, uint16(0)
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q: the port is not 1-65535", s)
		}
		host, port = h, uint16(n)
	}
	if isLocalhost(host) {
		return []Target{{netip.MustParsePrefix("127.0.0.0/8"), port}, {netip.MustParsePrefix("::1/128"), port}}, nil
	}
	if strings.Contains(host, "/") {
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return nil, fmt.Errorf("%q is not an address, a prefix (127.0.0.0/8) or localhost, with or without a port", s)
		}
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("%q: write an IPv4 prefix as such (127.0.0.0/8)", s)
		}
		return []Target{{p.Masked(), port}}, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return nil, fmt.Errorf("%q is not an address, a prefix (127.0.0.0/8) or localhost, with or without a port", s)
	}
	ip = ip.Unmap().WithZone("")
	return []Target{{netip.PrefixFrom(ip, ip.BitLen()), port}}, nil
}

// PortRange is an entry of Config.ConnectPorts: the ports Lo to Hi.
type PortRange struct{ Lo, Hi uint16 }

// DefaultConnectPorts are the ports a CONNECT may reach when
// Config.ConnectPorts is nil: HTTPS only, so that the proxy is no tunnel to
// SSH, SMTP or a database.
var DefaultConnectPorts = []PortRange{{443, 443}}

// ParsePortRange reads an http.connect_ports entry: a port ("443") or a
// range ("8000-8999").
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if !isRange {
		hi = lo
	}
	a, errA := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, errB := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if errA != nil || errB != nil || a == 0 || b < a {
		return PortRange{}, fmt.Errorf("%q is not a port (1-65535) or a range of them (8000-8999)", s)
	}
	return PortRange{uint16(a), uint16(b)}, nil
}

func (r PortRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(int(r.Lo))
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// connectAllowed reports whether a CONNECT may reach port.
func connectAllowed(ranges []PortRange, port uint16) bool {
	if ranges == nil {
		ranges = DefaultConnectPorts
	}
	for _, r := range ranges {
		if port >= r.Lo && port <= r.Hi {
			return true
		}
	}
	return false
}

func portList(ranges []PortRange) string {
	if ranges == nil {
		ranges = DefaultConnectPorts
	}
	if len(ranges) == 0 {
		return "none"
	}
	s := make([]string, len(ranges))
	for i, r := range ranges {
		s[i] = r.String()
	}
	return strings.Join(s, ", ")
}

// governordRefresh is how long the addresses governord's names resolve to
// are trusted before they are looked up again.
const governordRefresh = 30 * time.Second

// governordAddrs are the addresses governord is reached at, as targets the
// proxy refuses: what the configured host:port pairs resolve to. A name
// that cannot be resolved refuses its port on every address until it can
// (fail closed: it is governord's port).
type governordAddrs struct {
	configured []string // host:port

	mu       sync.Mutex
	resolved []netip.AddrPort // an invalid address stands for "any", on its port
	at       time.Time
	fixed    bool // every address is a literal: resolved once for good
}

// get returns governord's addresses, looking names up again once the last
// answer is older than governordRefresh.
func (g *governordAddrs) get(ctx context.Context, r Resolver) []netip.AddrPort {
	if g == nil || len(g.configured) == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resolved != nil && (g.fixed || time.Since(g.at) < governordRefresh) {
		return g.resolved
	}
	var out []netip.AddrPort
	fixed := true
	for _, hp := range g.configured {
		host, portStr, err := net.SplitHostPort(hp)
		if err != nil {
			continue
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil {
			continue
		}
		var ips []netip.Addr
		switch ip, err := netip.ParseAddr(trimBrackets(host)); {
		case err == nil:
			ips = []netip.Addr{ip.Unmap()}
		case isLocalhost(host):
			ips = loopbacks
		default:
			fixed = false
			lctx, cancel := context.WithTimeout(ctx, time.Second)
			ips, err = r.LookupNetIP(lctx, "ip", host)
			cancel()
			if err != nil || len(ips) == 0 {
				ips = []netip.Addr{{}}
			}
		}
		for _, ip := range ips {
			out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(port)))
		}
	}
	g.resolved, g.at, g.fixed = out, time.Now(), fixed
	return out
}

// isGovernord reports whether ip:port is governord: one of its addresses,
// or, when governord listens on this host, any local address on its port.
func isGovernord(gov []netip.AddrPort, ip netip.Addr, port uint16) bool {
	for _, g := range gov {
		if g.Port() != port {
			continue
		}
		if !g.Addr().IsValid() || g.Addr() == ip || (isLocal(g.Addr()) && isLocal(ip)) {
			return true
		}
	}
	return false
}

// isLocal reports whether ip reaches this host.
func isLocal(ip netip.Addr) bool { return ip.IsLoopback() || ip.IsUnspecified() || isLocalAddr(ip) }
