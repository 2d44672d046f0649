package envsubst

import "testing"

func TestExpand(t *testing.T) {
	t.Setenv("ENVSUBST_KEY", "s3cr$t")
	for in, want := range map[string]string{
		"key: ${ENVSUBST_KEY}":      "key: s3cr$t",
		"key: $ENVSUBST_KEY":        "key: $ENVSUBST_KEY",
		"key: ${ENVSUBST_UNSET_42}": "key: ",
		"key: ${not valid}":         "key: ${not valid}",
	} {
		if got := string(Expand([]byte(in))); got != want {
			t.Errorf("Expand(%q) = %q, want %q", in, got, want)
		}
	}
}
