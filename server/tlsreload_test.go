package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestTLSCertificateRotates rotates governord's certificate as
// cert-manager does (a Secret volume's "..data" symlink swapped to a new
// folder): a new connection gets the new certificate, a connection opened
// before goes on over the same TLS session with its session, and a pair
// that does not load is refused, logged and counted, with the new one
// still in force. No restart.
func TestTLSCertificateRotates(t *testing.T) {
	a, b := testcert.New(t, "127.0.0.1"), testcert.New(t, "127.0.0.1")
	roots := testcert.Trusting(a, b)
	v := testcert.NewVolume(t, a.CertFile, a.KeyFile)
	cfg := testConfig()
	cfg.TLS = serverconfig.TLSConfig{CertFile: v.CertFile, KeyFile: v.KeyFile}
	cfg.TLSReloadInterval = 5 * time.Millisecond
	logs := &logBuffer{}
	srv, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	connect := func() governorpb.GovernorClient {
		conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return governorpb.NewGovernorClient(conn)
	}
	// shown is the certificate the server showed on the connection a call
	// went over.
	shown := func(p *peer.Peer) []byte {
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok {
			t.Fatalf("the call did not go over TLS: %T", p.AuthInfo)
		}
		return info.State.PeerCertificates[0].Raw
	}
	reloads := func(outcome string) float64 {
		var m dto.Metric
		if err := srv.metrics.tlsReloads.WithLabelValues(outcome).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}

	old := connect()
	var p peer.Peer
	resp, err := old.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key"}, grpc.Peer(&p))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shown(&p), a.TLS.Certificate[0]) {
		t.Fatal("the first connection did not see the first certificate")
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.SessionToken)

	v.Rotate(b.CertFile, b.KeyFile)
	waitFor(t, func() bool { return reloads("success") == 1 })
	if _, err := connect().OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key"}, grpc.Peer(&p)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shown(&p), b.TLS.Certificate[0]) {
		t.Error("a connection after the rotation did not see the new certificate")
	}
	// The connection from before is the same TLS session (it still shows
	// the old certificate), and its session works.
	if _, err := old.Heartbeat(ctx, &governorpb.HeartbeatRequest{}, grpc.Peer(&p)); err != nil {
		t.Fatalf("a heartbeat on the connection opened before the rotation: %v", err)
	}
	if !bytes.Equal(shown(&p), a.TLS.Certificate[0]) {
		t.Error("the connection opened before the rotation was made again")
	}

	v.Rotate(a.CertFile, b.KeyFile) // a certificate with another's key
	waitFor(t, func() bool { return reloads("failure") == 1 })
	if _, err := connect().OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key"}, grpc.Peer(&p)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shown(&p), b.TLS.Certificate[0]) {
		t.Error("a pair that failed to load replaced the certificate in force")
	}
	if _, err := old.Heartbeat(ctx, &governorpb.HeartbeatRequest{}); err != nil {
		t.Fatalf("a heartbeat after a failed reload: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, `msg="TLS certificate reloaded"`) || !strings.Contains(out, `msg="the TLS certificate failed to load; the one in force stays"`) {
		t.Errorf("the log does not show the reload and the failure:\n%s", out)
	}
	if strings.Contains(out, "PRIVATE KEY") {
		t.Errorf("the log shows key material:\n%s", out)
	}
}
