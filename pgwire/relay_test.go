package pgwire_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/pgwire"
)

func TestPgxExecModes(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	ctx := context.Background()
	setup := connect(t, superDSN(addr))
	exec1(t, setup, "DROP TABLE IF EXISTS pgx_modes")
	exec1(t, setup, "CREATE TABLE pgx_modes (id int primary key, mode text, payload bytea)")
	for i, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			c := connectMode(t, superDSN(addr), mode)
			for j := range 3 { // a second and third time hit the statement caches
				id := i*10 + j
				if _, err := c.Exec(ctx, "INSERT INTO pgx_modes VALUES ($1, $2, $3)", id, mode.String(), []byte{0, 1, byte(j)}); err != nil {
					t.Fatal(err)
				}
				var got string
				if err := c.QueryRow(ctx, "SELECT mode FROM pgx_modes WHERE id = $1", id).Scan(&got); err != nil || got != mode.String() {
					t.Fatalf("select: %q, %v", got, err)
				}
			}
			// An error in the extended protocol, then the connection goes on.
			if _, err := c.Exec(ctx, "SELECT 1/0"); sqlState(err) != "22012" {
				t.Fatalf("1/0: %v", err)
			}
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "UPDATE pgx_modes SET mode = 'x' WHERE id = $1", i*10); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			// A batch: one pipeline, one Sync.
			b := &pgx.Batch{}
			b.Queue("SELECT count(*) FROM pgx_modes WHERE mode = $1", mode.String())
			b.Queue("SELECT $1::int + 1", 41)
			br := c.SendBatch(ctx, b)
			var n, v int
			if err := br.QueryRow().Scan(&n); err != nil || n != 3 {
				t.Fatalf("batch count %d, %v", n, err)
			}
			if err := br.QueryRow().Scan(&v); err != nil || v != 42 {
				t.Fatalf("batch 41+1 = %d, %v", v, err)
			}
			if err := br.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPipelineCopyNotify(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	ctx := context.Background()
	c := connect(t, superDSN(addr))

	// A low-level pipeline with several Syncs in flight.
	p := c.PgConn().StartPipeline(ctx)
	p.SendQueryParams("SELECT $1::int", [][]byte{[]byte("1")}, nil, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams("SELECT $1::int * 2", [][]byte{[]byte("21")}, nil, nil, nil)
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		r, err := p.GetResults()
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			break
		}
		switch r := r.(type) {
		case *pgconn.ResultReader:
			res := r.Read()
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			got = append(got, string(res.Rows[0][0]))
		case *pgconn.PipelineSync:
			if len(got) == 2 {
				goto done
			}
		}
	}
done:
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "1,42" {
		t.Fatalf("pipeline results %v", got)
	}

	// COPY FROM, streamed.
	exec1(t, c, "DROP TABLE IF EXISTS copy_in")
	exec1(t, c, "CREATE TABLE copy_in (id int, s text)")
	rows := make([][]any, 5000)
	for i := range rows {
		rows[i] = []any{i, strings.Repeat("x", i%100)}
	}
	n, err := c.CopyFrom(ctx, pgx.Identifier{"copy_in"}, []string{"id", "s"}, pgx.CopyFromRows(rows))
	if err != nil || n != 5000 {
		t.Fatalf("copy from: %d, %v", n, err)
	}
	// COPY TO.
	var sb strings.Builder
	tag, err := c.PgConn().CopyTo(ctx, &sb, "COPY (SELECT id FROM copy_in ORDER BY id LIMIT 3) TO STDOUT")
	if err != nil || tag.RowsAffected() != 3 || sb.String() != "0\n1\n2\n" {
		t.Fatalf("copy to: %q %v %v", sb.String(), tag, err)
	}

	// LISTEN/NOTIFY: the notification arrives unasked, from another session.
	exec1(t, c, "LISTEN pgwire_chan")
	other := connect(t, superDSN(addr))
	exec1(t, other, "SELECT pg_notify('pgwire_chan', 'hello')")
	wctx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	note, err := c.WaitForNotification(wctx)
	if err != nil || note.Payload != "hello" {
		t.Fatalf("notification %+v, %v", note, err)
	}

	// Large objects ride on FunctionCall-era functions; pgx uses SQL for
	// them, psql's \lo_import uses the fastpath FunctionCall.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	los := tx.LargeObjects()
	oid, err := los.Create(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := los.Open(ctx, oid, pgx.LargeObjectModeWrite|pgx.LargeObjectModeRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lo.Write([]byte("large object")); err != nil {
		t.Fatal(err)
	}
	if _, err := lo.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	k, _ := lo.Read(buf)
	if string(buf[:k]) != "large object" {
		t.Fatalf("large object read %q", buf[:k])
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestFunctionCallLargeObject(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	host, port, _ := net.SplitHostPort(addr)
	f := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(f, []byte("fastpath bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	// psql's \lo_import and \lo_export use libpq's lo_* calls, which are
	// FunctionCall messages.
	script := fmt.Sprintf("\\lo_import %s\n\\set oid :LASTOID\n\\lo_export :oid %s\n\\lo_unlink :oid\n", f, out)
	cmd := exec.Command("psql", "-X", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", "governor", "-d", "governor")
	cmd.Env = append(os.Environ(), "PGPASSWORD=governor")
	cmd.Stdin = strings.NewReader(script)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("psql: %v\n%s", err, b)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "fastpath bytes" {
		t.Fatalf("exported %q, %v", b, err)
	}
}

func TestCancel(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tlsOn), func(t *testing.T) {
			p := &pgwire.Proxy{}
			mode := "disable"
			if tlsOn {
				p.TLSConfig = tlsConfig(t)
				mode = "require"
			}
			addr := startProxy(t, p)
			c := connect(t, strings.Replace(superDSN(addr), "sslmode=disable", "sslmode="+mode, 1))
			watch := connect(t, superDSN(addr))
			ctx := context.Background()
			errc := make(chan error, 1)
			go func() {
				_, err := c.Exec(ctx, "SELECT pg_sleep(30) -- cancel me")
				errc <- err
			}()
			// Wait until the server runs it (polling a real signal, not sleeping).
			deadline := time.Now().Add(10 * time.Second)
			for {
				var n int
				if err := watch.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%cancel me'").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("pg_sleep never showed up in pg_stat_activity")
				}
				runtime.Gosched()
			}
			start := time.Now()
			if err := c.PgConn().CancelRequest(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; sqlState(err) != "57014" {
				t.Fatalf("pg_sleep: %v, want 57014 (canceled)", err)
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("cancel took %v", time.Since(start))
			}
			var one int
			if err := c.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPgbench(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	host, port, _ := net.SplitHostPort(addr)
	env := append(os.Environ(), "PGPASSWORD=governor", "PGHOST="+host, "PGPORT="+port, "PGUSER=governor", "PGDATABASE=governor")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("pgbench", args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pgbench %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("-i", "-q", "-s", "1") // COPY in
	for _, mode := range []string{"simple", "extended", "prepared"} {
		out := run("-M", mode, "-c", "4", "-j", "2", "-T", "2", "-n")
		if !strings.Contains(out, "number of failed transactions: 0") {
			t.Fatalf("pgbench -M %s:\n%s", mode, out)
		}
		t.Logf("pgbench -M %s: %s", mode, lineWith(out, "tps ="))
	}
}

func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
