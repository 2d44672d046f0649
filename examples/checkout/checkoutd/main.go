// Command checkoutd is the example's checkout service: an ordinary Go HTTP
// service that knows nothing of Governor. POST /checkout records an order in
// PostgreSQL, charges it at the payment gateway (retrying twice when the
// gateway answers 429), and marks the order paid or failed.
//
// It is configured by its environment only, as a service in a container is:
//
//	LISTEN        where to serve (default 127.0.0.1:8080)
//	DATABASE_URL  the PostgreSQL DSN
//	PSP_URL       the payment gateway's base URL, e.g. http://psp.internal:9000
//
// Its HTTP client uses http.ProxyFromEnvironment, so HTTP_PROXY puts a proxy
// in front of the gateway; DATABASE_URL can point at a pgwire proxy. That is
// all it takes to run it under Governor: see the package examples/checkout.
// It logs JSON lines, the first of them "checkout listening" with its
// address.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error("checkout failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	listen := envOr("LISTEN", "127.0.0.1:8080")
	dsn, psp := os.Getenv("DATABASE_URL"), os.Getenv("PSP_URL")
	if dsn == "" || psp == "" {
		return errors.New("DATABASE_URL and PSP_URL must be set")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	// The default transport's settings, with Proxy: ProxyFromEnvironment,
	// and enough idle connections for the load this service takes.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	s := &service{db: db, psp: psp, http: &http.Client{Transport: tr, Timeout: 15 * time.Second}, log: log}

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /checkout", s.checkout)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("checkout listening", "addr", ln.Addr().String())
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

type service struct {
	db   *sql.DB
	psp  string
	http *http.Client
	log  *slog.Logger
}

// errBusy is the gateway still answering 429 after the last retry.
var errBusy = errors.New("the payment gateway is busy")

// pspAttempts is how often a charge is tried: the first time and two
// retries, a common setting in payment clients.
const pspAttempts = 3

func (s *service) checkout(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	amount, err := strconv.Atoi(r.URL.Query().Get("amount"))
	if err != nil || amount <= 0 {
		http.Error(w, "amount must be a positive number of cents", http.StatusBadRequest)
		return
	}
	var id int64
	if err := s.db.QueryRowContext(ctx, `INSERT INTO orders (amount, status) VALUES ($1, 'pending') RETURNING id`, amount).Scan(&id); err != nil {
		s.fail(w, "record the order", err, http.StatusInternalServerError)
		return
	}
	charge, err := s.charge(ctx, id, amount)
	if err != nil {
		if _, uerr := s.db.ExecContext(ctx, `UPDATE orders SET status = 'failed' WHERE id = $1`, id); uerr != nil {
			err = errors.Join(err, uerr)
		}
		code := http.StatusBadGateway
		if errors.Is(err, errBusy) {
			code = http.StatusServiceUnavailable
		}
		s.fail(w, "charge the order", err, code)
		return
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE orders SET status = 'paid', charge_id = $2 WHERE id = $1`, id, charge); err != nil {
		s.fail(w, "mark the order paid", err, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"order": id, "charge": charge})
}

// charge asks the gateway to charge an order, retrying on 429 with a short
// backoff.
func (s *service) charge(ctx context.Context, order int64, amount int) (string, error) {
	for attempt := 1; ; attempt++ {
		id, status, err := s.chargeOnce(ctx, order, amount)
		if err != nil {
			return "", err
		}
		if status == http.StatusOK {
			return id, nil
		}
		if status != http.StatusTooManyRequests {
			return "", fmt.Errorf("the payment gateway answered %d", status)
		}
		if attempt == pspAttempts {
			return "", errBusy
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}

func (s *service) chargeOnce(ctx context.Context, order int64, amount int) (string, int, error) {
	url := fmt.Sprintf("%s/v1/charges?order=%d&amount=%d", s.psp, order, amount)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	var body struct {
		ID string `json:"id"`
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return "", 0, fmt.Errorf("the payment gateway's answer: %w", err)
		}
	}
	return body.ID, resp.StatusCode, nil
}

func (s *service) fail(w http.ResponseWriter, what string, err error, code int) {
	s.log.Warn("checkout failed", "step", what, "err", err, "status", code)
	http.Error(w, fmt.Sprintf("could not %s: %v", what, err), code)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
