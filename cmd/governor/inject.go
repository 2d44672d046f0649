package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/governor-project/governor/internal/tlsreload"
	"github.com/governor-project/governor/kubeinject"
)

const injectUsage = `usage: governor inject [-config inject.yaml] -f FILE
       governor inject serve [-config inject.yaml] -tls-cert FILE -tls-key FILE [-listen :8443]

Adds governor-proxy as a native sidecar to the pods that ask for it
(annotation governor.dev/inject: "true"; governor.dev/config names the
ConfigMap of its proxy.yaml). deploy/helm/governor/README.md describes the
annotations and what an injected pod looks like.

governor inject -f reads Kubernetes manifests (a file, or - for stdin) and
prints them with every pod template that asks injected, as the webhook
would inject its pods: for GitOps, without a webhook. It says on stderr
what it did with each template, and injects nothing if one is refused.

governor inject serve is the mutating admission webhook: it serves POST
/mutate (AdmissionReview v1) and GET /healthz over TLS, reloading the
certificate and key when their files change.

-config is the injector's config (the Helm chart renders it); without it,
the defaults.

flags:
`

// DefaultInjectListen is where the webhook listens unless -listen says.
const DefaultInjectListen = ":8443"

// injectShutdownTimeout is how long reviews in flight get on SIGTERM; the
// API server gives a review 10 s at most.
const injectShutdownTimeout = 10 * time.Second

func injectCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "serve" {
		return injectServe(args[1:], stderr)
	}
	fs := flag.NewFlagSet("governor inject", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, injectUsage); fs.PrintDefaults() }
	configPath := fs.String("config", "", "the injector's config (YAML); default: the built-in defaults")
	file := fs.String("f", "", "the manifests to inject (YAML, several documents allowed); - reads stdin")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	if *file == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "governor inject: -f FILE is required, and nothing else")
		return 2
	}
	cfg, code := injectConfig(*configPath, stderr)
	if code != 0 {
		return code
	}
	in := stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			fmt.Fprintln(stderr, "governor inject:", err)
			return 2
		}
		defer f.Close()
		in = f
	}
	results, err := kubeinject.InjectManifests(in, stdout, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "governor inject: %s: %v\n", *file, err)
		return 1
	}
	for _, r := range results {
		fmt.Fprintf(stderr, "governor inject: document %d, %s %s: %s\n", r.Document, r.Kind, r.Name, r.Outcome)
	}
	return 0
}

func injectConfig(path string, stderr io.Writer) (kubeinject.Config, int) {
	if path == "" {
		return kubeinject.DefaultConfig(), 0
	}
	cfg, err := kubeinject.LoadConfig(path)
	if err != nil {
		fmt.Fprintln(stderr, "governor inject:", err)
		return cfg, 2
	}
	return cfg, 0
}

func injectServe(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor inject serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, injectUsage); fs.PrintDefaults() }
	configPath := fs.String("config", "", "the injector's config (YAML); default: the built-in defaults")
	listen := fs.String("listen", DefaultInjectListen, "the address to serve the webhook on (TLS)")
	certFile := fs.String("tls-cert", "", "the webhook's certificate (PEM; required), reloaded when it changes")
	keyFile := fs.String("tls-key", "", "the certificate's key (PEM; required)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	if *certFile == "" || *keyFile == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "governor inject serve: -tls-cert and -tls-key are required, and no arguments")
		return 2
	}
	cfg, code := injectConfig(*configPath, stderr)
	if code != 0 {
		return code
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serveWebhook(ctx, cfg, *listen, *certFile, *keyFile, log); err != nil {
		fmt.Fprintln(stderr, "governor inject serve:", err)
		return 1
	}
	return 0
}

// serveWebhook serves until ctx ends, then lets reviews in flight finish.
func serveWebhook(ctx context.Context, cfg kubeinject.Config, listen, certFile, keyFile string, log *slog.Logger) error {
	certs, err := tlsreload.New(certFile, keyFile, tlsreload.Options{OnReload: func(_ *tls.Certificate, err error) {
		if err != nil {
			log.Error("the new certificate does not load; the old one stays", "err", err)
			return
		}
		log.Info("certificate reloaded")
	}})
	if err != nil {
		return fmt.Errorf("the certificate: %w", err)
	}
	defer certs.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mutate", &kubeinject.Webhook{Config: cfg, Log: log})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	// Said once the listener is bound: a test or a script waits for it.
	log.Info("serving", "addr", ln.Addr().String())
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), injectShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("stopping: %w", err)
	}
	return nil
}
