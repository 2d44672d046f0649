// Package envsubst expands ${VAR} references in configuration text, the one
// way governord, the proxy and the rules all read it. It may import only the
// standard library.
package envsubst

import (
	"os"
	"regexp"
)

var ref = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Expand replaces each ${VAR} with the variable's value; an unset variable
// becomes empty. Only the braced form is expanded, so a "$" inside a key or
// a password is left alone.
func Expand(text []byte) []byte {
	return ref.ReplaceAllFunc(text, func(m []byte) []byte {
		return []byte(os.Getenv(string(ref.FindSubmatch(m)[1])))
	})
}
