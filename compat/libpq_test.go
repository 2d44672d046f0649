package compat

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
)

// lib/pq's cells are Go, through database/sql, as a Go program uses it.

// libpqVersion is lib/pq's version as go.mod requires it. A test binary
// carries no module versions of its own.
func libpqVersion(t *testing.T) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/lib/pq").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/lib/pq: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func libpqCells(target pgTarget) map[string]result {
	cells := map[string]result{}
	db, err := sql.Open("postgres", target.dsn())
	if err != nil {
		cells["connect"] = result{Cell: "connect", Result: "fail", Detail: err.Error()}
		return cells
	}
	defer db.Close()
	for _, c := range []struct {
		name string
		fn   func(context.Context, *sql.DB, pgTarget) (string, error)
	}{
		{"connect", pqConnect}, {"simple", pqSimple}, {"prepared", pqPrepared}, {"transactions", pqTransactions},
		{"denial", pqDenial}, {"copy", pqCopy}, {"listen", pqListen}, {"cancel", pqCancel}, {"disconnect", pqDisconnect},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		detail, err := c.fn(ctx, db, target)
		cancel()
		switch {
		case errors.Is(err, errSkip):
			cells[c.name] = result{Cell: c.name, Result: "skip", Detail: detail}
		case err != nil:
			cells[c.name] = result{Cell: c.name, Result: "fail", Detail: err.Error()}
		default:
			cells[c.name] = result{Cell: c.name, Result: "ok", Detail: detail}
		}
	}
	return cells
}

var errSkip = errors.New("does not apply")

func pqConnect(ctx context.Context, db *sql.DB, _ pgTarget) (string, error) {
	var user string
	if err := db.QueryRowContext(ctx, "SELECT current_user").Scan(&user); err != nil {
		return "", err
	}
	if user != scramUser {
		return "", fmt.Errorf("connected as %s", user)
	}
	return "SCRAM-SHA-256 as " + user, nil
}

func pqSimple(ctx context.Context, db *sql.DB, _ pgTarget) (string, error) {
	rows, err := db.QueryContext(ctx, "SELECT 1; SELECT 2") // no arguments: the simple protocol
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var got []int
	for {
		for rows.Next() {
			var n int
			if err := rows.Scan(&n); err != nil {
				return "", err
			}
			got = append(got, n)
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if fmt.Sprint(got) != "[1 2]" {
		return "", fmt.Errorf("got %v", got)
	}
	return "", nil
}

func pqPrepared(ctx context.Context, db *sql.DB, _ pgTarget) (string, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stmt, err := conn.PrepareContext(ctx, "SELECT $1::int + 1")
	if err != nil {
		return "", err
	}
	defer stmt.Close()
	var n int
	for range 2 {
		if err := stmt.QueryRowContext(ctx, 41).Scan(&n); err != nil {
			return "", err
		}
	}
	if n != 42 {
		return "", fmt.Errorf("got %d", n)
	}
	return "extended protocol, named statement", nil
}

func pqCount(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, where string) (int, error) {
	var n int
	err := q.QueryRowContext(ctx, "SELECT count(*) FROM compat_items WHERE "+where).Scan(&n)
	return n, err
}

func pqTransactions(ctx context.Context, db *sql.DB, _ pgTarget) (string, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO compat_items VALUES (1, 'committed')"); err != nil {
		return "", err
	}
	if err := tx.Commit(); err != nil {
		return "", err
	}
	if tx, err = db.BeginTx(ctx, nil); err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO compat_items VALUES (2, 'rolled back')"); err != nil {
		return "", err
	}
	if err := tx.Rollback(); err != nil {
		return "", err
	}
	n, err := pqCount(ctx, db, "id IN (1, 2)")
	if err != nil || n != 1 {
		return "", fmt.Errorf("rows %d, %v", n, err)
	}
	return "", nil
}

func pqDenial(ctx context.Context, db *sql.DB, target pgTarget) (string, error) {
	if target.mode == "direct" {
		return "not governed", errSkip
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO compat_items VALUES (3, 'before the denial')"); err != nil {
		return "", err
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO compat_denied VALUES (1)")
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "53400" {
		return "", fmt.Errorf("the denied INSERT: %v", err)
	}
	commitErr := tx.Commit() // must not commit the first INSERT
	n, err := pqCount(ctx, conn, "id = 3")
	if err != nil || n != 0 {
		return "", fmt.Errorf("after COMMIT (%v): rows %d, %v", commitErr, n, err)
	}
	return fmt.Sprintf("53400; COMMIT committed nothing (lib/pq: %v); the connection went on", commitErr), nil
}

func pqCopy(ctx context.Context, db *sql.DB, _ pgTarget) (string, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, pq.CopyIn("compat_items", "id", "v"))
	if err != nil {
		return "", err
	}
	for i, v := range []string{"ten", "eleven", "twelve"} {
		if _, err := stmt.ExecContext(ctx, 10+i, v); err != nil {
			return "", err
		}
	}
	if _, err := stmt.ExecContext(ctx); err != nil {
		return "", err
	}
	if err := stmt.Close(); err != nil {
		return "", err
	}
	if err := tx.Commit(); err != nil {
		return "", err
	}
	n, err := pqCount(ctx, db, "id >= 10")
	if err != nil || n != 3 {
		return "", fmt.Errorf("rows %d, %v", n, err)
	}
	return "FROM STDIN (lib/pq has no COPY TO STDOUT)", nil
}

func pqListen(ctx context.Context, db *sql.DB, target pgTarget) (string, error) {
	problems := make(chan error, 8)
	l := pq.NewListener(target.dsn(), 10*time.Millisecond, time.Second, func(ev pq.ListenerEventType, err error) {
		if err != nil {
			select {
			case problems <- err:
			default:
			}
		}
	})
	defer l.Close()
	if err := l.Listen("compat_channel"); err != nil {
		return "", err
	}
	if _, err := db.ExecContext(ctx, "NOTIFY compat_channel, 'hello'"); err != nil {
		return "", err
	}
	select {
	case n := <-l.Notify:
		if n == nil || n.Extra != "hello" {
			return "", fmt.Errorf("got %+v", n)
		}
		return "pq.Listener", nil
	case err := <-problems:
		return "", err
	case <-ctx.Done():
		return "", errors.New("no notification")
	}
}

// pqWaitActive waits until backend pid runs pg_sleep, so that a cancel
// meets it. There is no signal for another session's state: it polls.
func pqWaitActive(ctx context.Context, db *sql.DB, pid int) error {
	for {
		var n int
		err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query LIKE 'SELECT pg_sleep%'", pid).Scan(&n)
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("the query never showed as active")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func pqCancel(ctx context.Context, db *sql.DB, _ pgTarget) (string, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var pid int
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return "", err
	}
	qctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := conn.ExecContext(qctx, "SELECT pg_sleep(60)")
		done <- err
	}()
	if err := pqWaitActive(ctx, db, pid); err != nil {
		cancel()
		return "", err
	}
	cancel() // lib/pq sends a cancel request when the context ends
	err = <-done
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "57014" {
		if !errors.Is(err, context.Canceled) {
			return "", fmt.Errorf("the query ended with %v", err)
		}
	}
	// The statement must be gone from the server, not merely abandoned.
	var active int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", pid).Scan(&active); err != nil {
		return "", err
	}
	if active != 0 {
		return "", fmt.Errorf("after the cancel the statement still runs")
	}
	// lib/pq marks a connection whose context ended bad, so database/sql
	// drops it rather than reuse it; the next query gets another.
	var one int
	after := "the connection went on"
	if err := conn.QueryRowContext(ctx, "SELECT 1").Scan(&one); errors.Is(err, driver.ErrBadConn) {
		after = "database/sql drops the connection (driver.ErrBadConn)"
		err = db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	} else if err != nil {
		return "", fmt.Errorf("after the cancel, SELECT 1: %v", err)
	}
	if one != 1 {
		return "", errors.New("no SELECT 1 after the cancel")
	}
	return "context cancel sends a cancel request, which ends the statement; " + after, nil
}

func pqDisconnect(ctx context.Context, db *sql.DB, _ pgTarget) (string, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var pid int
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return "", err
	}
	if _, err := db.ExecContext(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		return "", err
	}
	var one int
	err = conn.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	if err == nil {
		return "", errors.New("the terminated connection still answered")
	}
	// Whether the error is the server's 57P01, a reset or driver.ErrBadConn
	// depends on what the driver reads first: the cell does not say.
	if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return "", fmt.Errorf("a new connection: %v", err)
	}
	return "the next query fails; database/sql drops the connection", nil
}
