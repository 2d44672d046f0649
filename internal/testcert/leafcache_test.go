package testcert

import (
	"crypto/tls"
	"errors"
	"testing"
)

func TestLeafCacheSignsEachHostOnce(t *testing.T) {
	var c LeafCache
	calls := 0
	gen := func() (*tls.Certificate, error) { calls++; return &tls.Certificate{}, nil }
	a, _ := c.Fetch("a.example", gen)
	a2, _ := c.Fetch("a.example", gen)
	if a != a2 || calls != 1 {
		t.Fatalf("the second fetch of a host made a leaf again (%d calls)", calls)
	}
	if _, err := c.Fetch("b.example", func() (*tls.Certificate, error) { return nil, errors.New("no") }); err == nil {
		t.Fatal("a failed leaf was not reported")
	}
	if b, _ := c.Fetch("b.example", gen); b == nil || calls != 2 {
		t.Fatalf("a failed leaf was kept (%d calls)", calls)
	}
}
