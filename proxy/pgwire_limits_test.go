package proxy

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/pgwire"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// The config's default is pgwire's, written out in package proxyconfig so
// that a reader of the file does not link the wire proxy.
func TestPGWireDefaultMaxMessageBytesIsPGWires(t *testing.T) {
	if proxyconfig.DefaultPGWireMaxMessageBytes != pgwire.DefaultMaxMessageSize {
		t.Fatalf("proxyconfig says %d, pgwire %d", proxyconfig.DefaultPGWireMaxMessageBytes, pgwire.DefaultMaxMessageSize)
	}
}

// pgwire[i].max_message_bytes: 256 MiB unless set, bounded, and what the
// listener's proxy enforces.
func TestPGWireMaxMessageBytes(t *testing.T) {
	listener := minimal + "pgwire:\n  - {listen: 127.0.0.1:6432, upstream: 127.0.0.1:5432%s}\n"
	cfg, err := proxyconfig.ParseConfig([]byte(strings.Replace(listener, "%s", "", 1)))
	if err != nil || cfg.PGWire[0].MaxMessageBytes != 256<<20 {
		t.Fatalf("default: %d, %v; want 256 MiB", cfg.PGWire[0].MaxMessageBytes, err)
	}
	cfg, err = proxyconfig.ParseConfig([]byte(strings.Replace(listener, "%s", ", max_message_bytes: 65536", 1)))
	if err != nil || cfg.PGWire[0].MaxMessageBytes != 65536 {
		t.Fatalf("65536: %d, %v", cfg.PGWire[0].MaxMessageBytes, err)
	}
	for _, bad := range []string{"0", "-1", "65535", "1073741825", "1MiB", "[1]"} {
		_, err := proxyconfig.ParseConfig([]byte(strings.Replace(listener, "%s", ", max_message_bytes: "+bad, 1)))
		var ce *proxyconfig.ConfigError
		if !errors.As(err, &ce) || ce.Key != "pgwire[0].max_message_bytes" {
			t.Errorf("max_message_bytes: %s: got %v, want a ConfigError for pgwire[0].max_message_bytes", bad, err)
		}
	}

	pgUpstream(t)
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: pgListenerYAML(t, ", max_message_bytes: 65536")})
	c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
	pgExec(t, c, "SELECT 1 -- "+strings.Repeat("x", 60<<10))
	_, err = c.Exec(context.Background(), "SELECT 1 -- "+strings.Repeat("x", 70<<10))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Severity != "FATAL" || pe.Code != "08P01" || !strings.Contains(pe.Message, "65536") {
		t.Fatalf("a statement over max_message_bytes: %v, want FATAL 08P01 naming the cap", err)
	}
}
