// Command governor-proxy is Governor's sidecar: a forward proxy that a
// worker points HTTP_PROXY and HTTPS_PROXY at, and PostgreSQL wire
// listeners (pgwire:) that its database DSN points at, which classify each
// request or statement by the same rules and admit it through governord,
// with one session and one task, before forwarding it.
//
//	governor-proxy -config proxy.yaml
//
// proxy.example.yaml documents every key. A bad config or bad flags exit
// with status 2 and a message naming the key; any other failure to start
// exits 1. On SIGTERM or SIGINT it stops accepting, lets requests in flight
// and open pgwire transactions finish for up to http.shutdown_timeout,
// releases every lease and exits 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/proxy"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stderr))
}

// run is the whole command; it returns the exit status. It stops when ctx
// ends or a SIGTERM or SIGINT arrives.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "the configuration file (YAML; see proxy.example.yaml)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: governor-proxy -config FILE [-log-level LEVEL]")
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "governor-proxy: -log-level: %q is not debug, info, warn or error\n", *level)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	cfg, err := proxyconfig.LoadConfig(*configPath)
	if err != nil {
		fmt.Fprintln(stderr, "governor-proxy:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set.
	endTracing, err := tracing.Setup(ctx, "governor-proxy")
	if err != nil {
		fmt.Fprintln(stderr, "governor-proxy:", err)
		return 2
	}
	defer endTracing(context.Background())
	p, err := proxy.Start(ctx, cfg, proxy.Options{Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "governor-proxy:", err)
		if proxyconfig.IsConfigError(err) {
			return 2
		}
		return 1
	}
	<-ctx.Done()
	log.Info("stopping", "cause", context.Cause(ctx), "shutdown_timeout", cfg.HTTP.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.HTTP.ShutdownTimeout)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		log.Error("stopped with an error", "err", err)
		return 1
	}
	return 0
}
