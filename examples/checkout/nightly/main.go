// Command nightly is the example's batch job: the nightly payout run. Its
// workers claim pending payouts from a PostgreSQL table, send each to the
// payment gateway, and record the result, as fast as they can, which is
// what batch jobs do. On 429 a worker backs off briefly and tries again,
// up to five times, then puts the payout back for later. It knows nothing of
// Governor.
//
// It is configured by its environment only:
//
//	DATABASE_URL  the PostgreSQL DSN
//	PSP_URL       the payment gateway's base URL
//	WORKERS       how many payouts it sends at once (default 24)
//
// Like checkoutd, it honours HTTP_PROXY. It runs until the payouts run out
// or it is stopped (SIGTERM), then logs "nightly done" with what it did.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error("nightly failed", "err", err)
		os.Exit(1)
	}
}

// counts is what the run did.
type counts struct {
	paid, busy, deferred, failed atomic.Int64
}

func run(ctx context.Context, log *slog.Logger) error {
	dsn, psp := os.Getenv("DATABASE_URL"), os.Getenv("PSP_URL")
	if dsn == "" || psp == "" {
		return errors.New("DATABASE_URL and PSP_URL must be set")
	}
	workers := 24
	if v := os.Getenv("WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("WORKERS=%q: want a positive number", v)
		}
		workers = n
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	// Fewer connections than workers: a worker holds one only while a
	// statement runs, not while it waits for the gateway.
	db.SetMaxOpenConns(min(workers, 10))
	db.SetMaxIdleConns(min(workers, 10))
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone() // Proxy: ProxyFromEnvironment
	tr.MaxIdleConnsPerHost = workers
	j := &job{db: db, psp: psp, http: &http.Client{Transport: tr, Timeout: 15 * time.Second}, log: log}
	log.Info("nightly started", "workers", workers)
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.work(ctx)
		}()
	}
	wg.Wait()
	log.Info("nightly done", "paid", j.n.paid.Load(), "psp_429", j.n.busy.Load(), "deferred", j.n.deferred.Load(),
		"failed", j.n.failed.Load(), "seconds", time.Since(start).Seconds())
	return nil
}

type job struct {
	db   *sql.DB
	psp  string
	http *http.Client
	log  *slog.Logger
	n    counts
}

// work pays payouts until there are none left or ctx ends.
func (j *job) work(ctx context.Context) {
	for ctx.Err() == nil {
		var id, amount int64
		err := j.db.QueryRowContext(ctx, `UPDATE payouts SET status = 'sending' WHERE id = (
			SELECT id FROM payouts WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
			RETURNING id, amount`).Scan(&id, &amount)
		if errors.Is(err, sql.ErrNoRows) {
			return
		}
		if err != nil {
			j.failed(ctx, "claim a payout", err)
			select { // the database is having trouble: do not spin
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		status := "pending" // put back for a later run unless it is paid
		if paid, err := j.send(ctx, id, amount); err != nil {
			j.failed(ctx, "send a payout", err)
		} else if paid {
			status = "paid"
			j.n.paid.Add(1)
		} else {
			j.n.deferred.Add(1)
		}
		// The payout's row is put right even as the job stops.
		if _, err := j.db.ExecContext(context.WithoutCancel(ctx), `UPDATE payouts SET status = $2 WHERE id = $1`, id, status); err != nil {
			j.failed(ctx, "record a payout", err)
		}
	}
}

// send posts one payout, retrying on 429; it reports false if the gateway
// was still busy after five tries.
func (j *job) send(ctx context.Context, id, amount int64) (bool, error) {
	for attempt := 1; attempt <= 5; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/payouts?payout=%d&amount=%d", j.psp, id, amount), nil)
		if err != nil {
			return false, err
		}
		resp, err := j.http.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return true, nil
		case http.StatusTooManyRequests:
			j.n.busy.Add(1)
		default:
			return false, fmt.Errorf("the payment gateway answered %d", resp.StatusCode)
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false, nil
}

func (j *job) failed(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return // stopping: the request was cut short, not failed
	}
	j.n.failed.Add(1)
	j.log.Warn("nightly: could not "+what, "err", err)
}
