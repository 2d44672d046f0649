// Package apikey holds what governord, the sidecar and the CLI agree on
// about API keys: how a key is hashed for api_key_sha256 (hex SHA-256 of
// the key's bytes), and the length under which a key draws a warning. It
// may import only the standard library.
package apikey

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// MinLen is the shortest key, in bytes, that draws no warning: 16 random
// bytes (or 32 hex digits, as `openssl rand -hex 16` makes) cannot be
// guessed, and governord does not slow down wrong guesses.
const MinLen = 16

// Hash is the SHA-256 of key, as 64 lower-case hex digits: the value of
// api_key_sha256 that stands for key.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// ParseHash reads an api_key_sha256 value: 64 hex digits, either case.
// Its error does not repeat the value.
func ParseHash(s string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	if len(s) != 2*sha256.Size {
		return h, fmt.Errorf("is %d characters long; want the %d hex digits of a SHA-256 (governor hash-key prints them)", len(s), 2*sha256.Size)
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("is not hex; want the %d hex digits of a SHA-256 (governor hash-key prints them)", 2*sha256.Size)
	}
	return h, nil
}
