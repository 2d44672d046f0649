// Command governord is Governor's central daemon: it holds the governed
// tree, answers the gRPC API and records every change before it replies.
//
//	governord -config governor.yaml
//
// A bad config or bad flags exit with status 2 and a message naming the key;
// any other failure to start, and a failed commit while serving, exit 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("governord", flag.ContinueOnError)
	configPath := fs.String("config", "", "the configuration file (YAML; see governor.example.yaml)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: governord -config FILE")
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg, err := serverconfig.LoadConfig(*configPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "governord:", err)
		return 2
	}
	cfg.HATestHooks = testHooks()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set.
	endTracing, err := tracing.Setup(ctx, "governord")
	if err != nil {
		fmt.Fprintln(os.Stderr, "governord:", err)
		return 2
	}
	defer endTracing(context.Background())
	srv, err := server.Start(ctx, cfg, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "governord:", err)
		if serverconfig.IsConfigError(err) {
			return 2
		}
		return 1
	}
	select {
	case <-ctx.Done():
		log.Info("stopping", "signal", context.Cause(ctx))
		if err := srv.Close(); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("stopped with an error", "err", err)
			return 1
		}
		return 0
	case err := <-srv.Fatal():
		// Serving stopped already; whatever was not committed was never
		// acknowledged, and a restart replays what was.
		log.Error("fatal", "err", err)
		return 1
	}
}
