package intercept

import (
	"crypto/tls"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Hosts is the list of hosts whose tunnels are intercepted. An entry is a
// host name (api.openai.com), a wildcard for every name below a domain, at
// any depth (*.stripe.com: api.stripe.com and a.b.stripe.com, not
// stripe.com), or an IP literal (127.0.0.1, ::1). Names match without
// regard to ASCII case or a trailing dot. No other pattern is accepted:
// interception is a decision per host, and a pattern such as api* could
// reach hosts nobody meant.
type Hosts struct {
	names    map[string]bool
	suffixes []string // ".stripe.com"
	ips      map[netip.Addr]bool
	patterns []string
}

// ParseHosts reads the entries of http.intercept.hosts. An error names the
// entry by its index.
func ParseHosts(entries []string) (*Hosts, error) {
	h := &Hosts{names: map[string]bool{}, ips: map[netip.Addr]bool{}}
	for i, e := range entries {
		if err := h.add(e); err != nil {
			return nil, fmt.Errorf("[%d] %q: %w", i, e, err)
		}
	}
	return h, nil
}

func (h *Hosts) add(e string) error {
	e = strings.TrimSpace(e)
	if ip, err := netip.ParseAddr(strings.Trim(e, "[]")); err == nil {
		if ip.Zone() != "" {
			return fmt.Errorf("an IP literal with a zone is not a host")
		}
		h.ips[ip.Unmap()] = true
		h.patterns = append(h.patterns, ip.Unmap().String())
		return nil
	}
	name := canonical(e)
	wild := strings.HasPrefix(name, "*.")
	if wild {
		name = name[2:]
	}
	if err := checkName(name); err != nil {
		return err
	}
	if wild {
		h.suffixes = append(h.suffixes, "."+name)
		h.patterns = append(h.patterns, "*."+name)
	} else {
		h.names[name] = true
		h.patterns = append(h.patterns, name)
	}
	return nil
}

// checkName accepts a DNS name: labels of letters, digits, '-' and '_'.
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("is empty")
	}
	if len(name) > 253 {
		return fmt.Errorf("is longer than 253 bytes")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("has an empty label or one over 63 bytes")
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%q is not a host name, a *.domain wildcard or an IP literal", name)
			}
		}
	}
	return nil
}

// canonical is a host name as it is compared: lower case, without a
// trailing dot.
func canonical(host string) string {
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// Match reports whether host (a name or an IP literal, without a port) is
// listed.
func (h *Hosts) Match(host string) bool {
	if h == nil {
		return false
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return h.ips[ip.Unmap()]
	}
	name := canonical(host)
	if h.names[name] {
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// Patterns are the entries as they are compared, in the order given.
func (h *Hosts) Patterns() []string { return slices.Clone(h.patterns) }

// Len is how many entries there are.
func (h *Hosts) Len() int { return len(h.patterns) }

// Interceptor is the listed hosts and their minter together: what the
// sidecar's HTTP side asks of interception (httpproxy.Interceptor).
type Interceptor struct {
	Hosts  *Hosts
	Minter *Minter
}

// Intercepts reports whether host's tunnels are intercepted.
func (i *Interceptor) Intercepts(host string) bool { return i.Hosts.Match(host) }

// Certificate is host's leaf, with the CA's certificate after it.
func (i *Interceptor) Certificate(host string) (*tls.Certificate, error) { return i.Minter.Leaf(host) }
