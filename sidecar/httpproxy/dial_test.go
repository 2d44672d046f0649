package httpproxy

import "testing"

func TestAllowLinkLocal(t *testing.T) {
	deny := &dialer{}
	if err := deny.refuseLiteral("169.254.169.254:80", "80"); err == nil {
		t.Error("a link-local address is not refused by default")
	}
	allow := &dialer{allowLinkLocal: true}
	if err := allow.refuseLiteral("169.254.169.254:80", "80"); err != nil {
		t.Errorf("http.allow_link_local: true still refuses: %v", err)
	}
}
