package governor_test

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/testcert"
)

// selfSigned makes a certificate for the fake's name ("fake", the authority
// of passthrough:///fake), and the CA file that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, string) {
	c := testcert.New(t, "fake")
	return c.TLS, c.CertFile
}

func TestCAFileTurnsTLSOnAndTrustsOnlyIt(t *testing.T) {
	cert, caFile := selfSigned(t)
	_, otherCA := selfSigned(t)
	opts := serveFake(t, newFake(time.Minute), grpc.Creds(credentials.NewServerTLSFromCert(&cert)))

	t.Run("option", func(t *testing.T) {
		c, err := governor.Dial(t.Context(), append(opts, governor.WithCAFile(caFile))...)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv(governor.EnvCAFile, caFile)
		t.Setenv(governor.EnvTLS, "false") // the CA file still turns TLS on
		c, err := governor.Dial(t.Context(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	})
	for name, opt := range map[string]governor.Option{
		"another CA":   governor.WithCAFile(otherCA),
		"system roots": governor.WithTLS(true),
		"plaintext":    governor.WithTLS(false),
	} {
		t.Run(name, func(t *testing.T) {
			// Long enough for a TLS handshake on a loaded machine: the refusal
			// comes from the handshake, not from the deadline.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			_, err := governor.Dial(ctx, append(opts, opt)...)
			if !errors.Is(err, governor.ErrUnavailable) {
				t.Fatalf("Dial = %v, want ErrUnavailable", err)
			}
		})
	}
}
