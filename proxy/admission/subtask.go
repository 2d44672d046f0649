package admission

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxSubtaskName is the longest subtask name, in bytes.
const MaxSubtaskName = 255

// CheckSubtaskName is the one rule for a subtask's name, whichever side
// read it (a Proxy-Authorization username, an application_name): at most
// MaxSubtaskName bytes of UTF-8 with no control character (C0, DEL, C1;
// NUL among them), since names end up in logs, in governor top and in the
// tree. The error completes a sentence whose subject is the name, for
// each side to say where the name came from.
func CheckSubtaskName(name string) error {
	switch {
	case len(name) > MaxSubtaskName:
		return fmt.Errorf("is longer than %d bytes", MaxSubtaskName)
	case !utf8.ValidString(name):
		return errors.New("is not valid UTF-8")
	}
	if i := strings.IndexFunc(name, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(name[i:])
		return fmt.Errorf("contains the control character %U", r)
	}
	return nil
}
