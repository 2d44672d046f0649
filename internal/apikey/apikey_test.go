package apikey

import (
	"crypto/sha256"
	"strings"
	"testing"
)

func TestHashAndParse(t *testing.T) {
	// The SHA-256 of "abc" (FIPS 180-2, appendix B.1).
	const abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := Hash("abc"); got != abc {
		t.Fatalf("Hash(abc) = %s", got)
	}
	for _, s := range []string{abc, strings.ToUpper(abc)} {
		h, err := ParseHash(s)
		if err != nil || h != sha256.Sum256([]byte("abc")) {
			t.Errorf("ParseHash(%s): %x %v", s, h, err)
		}
	}
	for _, bad := range []string{"", abc[:63], abc + "0", "zz" + abc[2:]} {
		if _, err := ParseHash(bad); err == nil {
			t.Errorf("ParseHash(%q) accepted", bad)
		} else if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("ParseHash's error repeats the value: %v", err)
		}
	}
}
