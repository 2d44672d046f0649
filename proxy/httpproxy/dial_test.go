package httpproxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestAllowLinkLocal(t *testing.T) {
	deny := &dialer{}
	if err := deny.refuseLiteral(context.Background(), "169.254.169.254:80", "80"); err == nil {
		t.Error("a link-local address is not refused by default")
	}
	allow := &dialer{allowLinkLocal: true}
	if err := allow.refuseLiteral(context.Background(), "169.254.169.254:80", "80"); err != nil {
		t.Errorf("http.allow_link_local: true still refuses: %v", err)
	}
}

// names resolves as the map says.
type names map[string][]netip.Addr

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if ips, ok := n[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func targets(t *testing.T, entries ...string) []Target {
	t.Helper()
	var out []Target
	for _, e := range entries {
		ts, err := ParseTarget(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ts...)
	}
	return out
}

// TestTargetChecks is the order of the checks, on the addresses a dial
// would use: the proxy itself always, governord unless an entry names its
// port, then loopback and link-local unless an entry covers them.
func TestTargetChecks(t *testing.T) {
	ip := netip.MustParseAddr
	res := names{"governord.svc": {ip("10.9.0.7")}, "down.svc": nil}
	self := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 7700}
	for _, tc := range []struct {
		name      string
		allow     []string
		governord []string
		target    string
		want      string // the refusal's reason, "" to pass
	}{
		{"the proxy itself", []string{"127.0.0.0/8"}, nil, "127.0.0.1:7700", "Loop Detected"},
		{"loopback", nil, nil, "127.0.0.1:8080", "Forbidden loopback destination"},
		{"loopback elsewhere in 127/8", nil, nil, "127.1.2.3:80", "Forbidden loopback destination"},
		{"IPv6 loopback", nil, nil, "[::1]:80", "Forbidden loopback destination"},
		{"IPv4-mapped loopback", nil, nil, "[::ffff:127.0.0.1]:80", "Forbidden loopback destination"},
		{"0.0.0.0 reaches this host", nil, nil, "0.0.0.0:80", "Forbidden loopback destination"},
		{":: reaches this host", nil, nil, "[::]:80", "Forbidden loopback destination"},
		{"localhost", nil, nil, "localhost:80", "Forbidden loopback destination"},
		{"loopback allowed by prefix", []string{"127.0.0.0/8"}, nil, "127.0.0.1:8080", ""},
		{"loopback allowed by address and port", []string{"127.0.0.1:8080"}, nil, "127.0.0.1:8080", ""},
		{"another port than allowed", []string{"127.0.0.1:8080"}, nil, "127.0.0.1:8081", "Forbidden loopback destination"},
		{"localhost allowed", []string{"localhost"}, nil, "localhost:80", ""},
		{"a public address", nil, nil, "93.184.215.14:80", ""},
		{"governord by address", nil, []string{"10.9.0.7:7600"}, "10.9.0.7:7600", "Forbidden governord destination"},
		{"governord's host, another port", nil, []string{"10.9.0.7:7600"}, "10.9.0.7:80", ""},
		{"governord by name", nil, []string{"governord.svc:7600"}, "10.9.0.7:7600", "Forbidden governord destination"},
		{"governord on loopback, reached by 0.0.0.0", []string{"0.0.0.0", "127.0.0.0/8"}, []string{"127.0.0.1:7600"}, "0.0.0.0:7600", "Forbidden governord destination"},
		{"governord on loopback, a prefix does not allow it", []string{"127.0.0.0/8"}, []string{"localhost:7600"}, "127.0.0.1:7600", "Forbidden governord destination"},
		{"governord allowed by its port", []string{"127.0.0.1:7600"}, []string{"127.0.0.1:7600"}, "127.0.0.1:7600", ""},
		{"governord's name unresolved: its port is refused", nil, []string{"down.svc:7600"}, "93.184.215.14:7600", "Forbidden governord destination"},
		{"link-local", nil, nil, "169.254.169.254:80", "Forbidden link-local destination"},
		{"link-local allowed by an entry", []string{"169.254.169.254:80"}, nil, "169.254.169.254:80", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &dialer{resolver: res, allow: targets(t, tc.allow...), governord: &governordAddrs{configured: tc.governord}}
			d.addSelf(self)
			err := d.refuseLiteral(context.Background(), tc.target, "80")
			var r *refusal
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s refused: %v", tc.target, err)
			case tc.want != "" && (!errors.As(err, &r) || r.reason != tc.want || r.cause != causeForbiddenTarget):
				t.Errorf("%s: %v, want %q with Governor-Denied %s", tc.target, err, tc.want, causeForbiddenTarget)
			case r != nil && r.reason != "Loop Detected" && r.code != http.StatusForbidden:
				t.Errorf("%s: status %d, want 403", tc.target, r.code)
			}
		})
	}
}

// TestNamesCheckedWhereDialed: a name is refused by what it resolves to,
// and the dial uses the checked addresses only.
func TestNamesCheckedWhereDialed(t *testing.T) {
	ip := netip.MustParseAddr
	d := &dialer{resolver: names{"rebind.test": {ip("93.184.215.14"), ip("127.0.0.1")}, "local.test": {ip("127.0.0.1")}},
		governord: &governordAddrs{}}
	if _, err := d.lookup(context.Background(), "local.test:80"); err == nil {
		t.Error("a name resolving to loopback was not refused")
	}
	got, err := d.lookup(context.Background(), "rebind.test:80")
	if err != nil || len(got.ips) != 1 || got.ips[0] != ip("93.184.215.14") {
		t.Errorf("a name with a loopback address among others: %+v %v; want only the public address kept", got, err)
	}
}

func TestParseTargetAndPorts(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1": "127.0.0.1", "127.0.0.0/8": "127.0.0.0/8", "127.0.0.1:8080": "127.0.0.1:8080",
		"[::1]:9000": "[::1]:9000", "::1": "::1", "10.1.2.3/8": "10.0.0.0/8", "::ffff:127.0.0.1": "127.0.0.1",
		"localhost": "127.0.0.0/8 ::1", "localhost:80": "127.0.0.0/8:80 [::1]:80", "127.0.0.0/8:80": "127.0.0.0/8:80",
	} {
		ts, err := ParseTarget(in)
		var s []string
		for _, t := range ts {
			s = append(s, t.String())
		}
		if err != nil || strings.Join(s, " ") != want {
			t.Errorf("ParseTarget(%q) = %v %v, want %s", in, s, err, want)
		}
	}
	for _, bad := range []string{"", "example.com", "127.0.0.1:0", "127.0.0.1:99999", "127.0.0.0/33", "10.0.0.0/8:x"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) accepted", bad)
		}
	}
	for in, want := range map[string]PortRange{"443": {443, 443}, "8000-8999": {8000, 8999}, " 1 - 65535 ": {1, 65535}} {
		if got, err := ParsePortRange(in); err != nil || got != want {
			t.Errorf("ParsePortRange(%q) = %v %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0", "65536", "9-8", "x", "1-"} {
		if _, err := ParsePortRange(bad); err == nil {
			t.Errorf("ParsePortRange(%q) accepted", bad)
		}
	}
	if !connectAllowed(nil, 443) || connectAllowed(nil, 22) || connectAllowed([]PortRange{}, 443) {
		t.Error("the default CONNECT ports are 443 only, and an empty list allows none")
	}
}
