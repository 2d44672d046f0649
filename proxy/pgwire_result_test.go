package proxy

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPGWireResultRowsQuota: a rule with result: {rows, bytes} charges the
// rows a SELECT returns, as the server sends them, against a real
// PostgreSQL, in the simple and the extended protocol. Under a quota of
// 100 rows: a result of 30 is charged 30 exactly; one of 100 that
// crosses the quota finishes whole (the client gets every row and no
// error) and leaves the quota exactly full; the next SELECT is refused
// with 53400 before it reaches the server, and the connection goes on.
func TestPGWireResultRowsQuota(t *testing.T) {
	pgUpstream(t)
	g := startGovernord(t, nil)
	a := newAdmin(t, g.Addr())
	for i, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			task := fmt.Sprintf("pgres%d", i)
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "task: {name: " + task + ", quotas: {rows_read: 100}}\n" +
				pgListenerYAML(t, "") + `
rules:
  - {name: reads, match: {sql: select}, result: {rows: rows_read, bytes: result_bytes}}
`})
			cfg, err := pgx.ParseConfig(pgDSN(p.PGWireAddrs()[0], ""))
			must(t, err)
			cfg.DefaultQueryExecMode = mode
			c, err := pgx.ConnectConfig(context.Background(), cfg)
			must(t, err)
			defer c.Close(context.Background())
			count := func(n int) int {
				rows, err := c.Query(context.Background(), "SELECT g FROM generate_series(1, $1::int) g", n)
				must(t, err)
				got := 0
				for rows.Next() {
					got++
				}
				if err := rows.Err(); err != nil {
					t.Fatalf("SELECT of %d rows: %v", n, err)
				}
				return got
			}
			used := func() int64 {
				p.settle()
				return a.node("payments", task).GetUsed()["rows_read"]
			}
			if n := count(30); n != 30 {
				t.Fatalf("got %d rows of 30", n)
			}
			if u := used(); u != 30 {
				t.Fatalf("governord counts %d rows_read after 30 rows", u)
			}
			if n := count(100); n != 100 {
				t.Fatalf("the result that crosses the quota: got %d rows of 100", n)
			}
			if u := used(); u != 100 {
				t.Fatalf("governord counts %d rows_read under a quota of 100", u)
			}
			wantPGError(t, c, "53400", "rows_read", "SELECT g FROM generate_series(1, $1::int) g", 5)
			pgExec(t, c, "SET work_mem = '8MB'") // the connection goes on (a SELECT would be refused too)
			if v := p.metric(`governor_proxy_pgwire_result_rows_total{rule="reads"}`); v != 130 {
				t.Errorf("governor_proxy_pgwire_result_rows_total = %v, want 130 asked", v)
			}
			if b := a.node("payments", task).GetUsed()["result_bytes"]; b <= 130 {
				t.Errorf("governord counts %d result_bytes for 130 rows", b)
			}
		})
	}
}
