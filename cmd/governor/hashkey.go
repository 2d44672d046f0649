package main

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/governor-project/governor/internal/apikey"
)

const hashKeyUsage = `usage: governor hash-key < keyfile
       printf %s "$KEY" | governor hash-key

Prints the SHA-256 of an API key, read from stdin, as the 64 hex digits that
governord's api_key_sha256 (or admin_key_sha256) takes instead of the key.
The key is never an argument: ps and the shell history would keep it. One
trailing newline ("\n" or "\r\n") is not part of the key.
`

// maxKeyLen bounds what hash-key reads: a key is a line, not a file.
const maxKeyLen = 64 << 10

// hashKey is `governor hash-key`.
func hashKey(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			io.WriteString(stdout, hashKeyUsage)
			return 0
		}
		io.WriteString(stderr, "governor hash-key: the key is read from stdin, never from the command line (ps and the shell history would keep it)\n\n"+hashKeyUsage)
		return 2
	}
	if f, ok := stdin.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			fmt.Fprintln(stderr, "governor hash-key: type the key and press Enter (it shows as you type), or pipe it in")
		}
	}
	key, err := io.ReadAll(io.LimitReader(stdin, maxKeyLen+1))
	if err != nil {
		fmt.Fprintln(stderr, "governor hash-key: reading stdin:", err)
		return 1
	}
	if len(key) > maxKeyLen {
		fmt.Fprintf(stderr, "governor hash-key: stdin holds more than %d bytes; give the key alone\n", maxKeyLen)
		return 2
	}
	key = bytes.TrimSuffix(key, []byte("\n"))
	key = bytes.TrimSuffix(key, []byte("\r"))
	if len(key) == 0 {
		io.WriteString(stderr, "governor hash-key: no key on stdin\n\n"+hashKeyUsage)
		return 2
	}
	if len(key) < apikey.MinLen {
		fmt.Fprintf(stderr, "governor hash-key: warning: the key is %d bytes long; a key shorter than %d bytes can be guessed (openssl rand -hex %d makes a good one)\n",
			len(key), apikey.MinLen, apikey.MinLen)
	}
	fmt.Fprintln(stdout, apikey.Hash(string(key)))
	return 0
}
