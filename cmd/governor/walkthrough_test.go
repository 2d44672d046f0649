package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/server/serverconfig"
)

var updateWalkthrough = flag.Bool("update-walkthrough", false, "write this run's output into docs/cli.md's incident walk-through")

// walkthroughDoc holds the walk-through: each output it shows is the
// ```text block right after a line "<!-- walkthrough NAME -->".
const walkthroughDoc = "../../docs/cli.md"

// TestIncidentWalkthrough plays the incident docs/cli.md walks through,
// with governord on SQLite and two sidecars whose pgwire listeners front a
// real PostgreSQL, and holds what the walk-through shows to what the built
// doctor, caps get and top print at each step: a full pool whose slots sit
// idle in delegated blocks, a transaction left open, and the tenant
// suspended. What differs from run to run (times, ages, ports, rates) and
// the width of the space between columns is not compared; everything else
// is. -update-walkthrough writes this run's output into the document.
func TestIncidentWalkthrough(t *testing.T) {
	pg := pgtest.Base(t)
	needTmux(t)
	buildCLI(t) // before any clock matters
	cfg := govtest.Config()
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db")}
	cfg.Tenants[0].Limits = map[string]int64{"db": 4}
	// A long TTL: a heartbeat made late by a busy test machine is no
	// finding of the walk-through's.
	cfg.SessionTTL = time.Minute
	srv := govtest.StartConfig(t, cfg)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)

	// Two workers, each with a sidecar in front of PostgreSQL that holds
	// a slot of db for each transaction; idle slots stay an hour.
	dial := map[string]string{}
	for _, pod := range []string{"pod-a", "pod-b"} {
		side, _ := startSidecar(t, fmt.Sprintf(`governor: {addr: %q, api_key: %s}
task: {name: %s}
metrics_listen: 127.0.0.1:0
http: {listen: 127.0.0.1:0}
pgwire:
  - {listen: 127.0.0.1:0, upstream: %q}
delegation: {enabled: true, linger: 1h}
rules:
  - {name: any-sql, match: {sql: any}, class: db}
`, srv.Addr(), govtest.TenantKey, pod, pg.Host))
		u := *pg
		u.Host = side.PGWireAddrs()[0]
		dial[pod] = u.String()
	}
	admin := adminRPC(t, srv.Addr())
	const tenant = 2
	// held waits until every block's use is reported and ok says the slots
	// in use and idle, under the tenant, are the ones the step needs.
	held := func(what string, ok func(inUse, idle int64) bool) *governorpb.Inspection {
		t.Helper()
		return waitInspect(t, admin, tenant, what, func(in *governorpb.Inspection) bool {
			var inUse, idle int64
			for _, l := range in.GetLeases() {
				if l.GetUseReported() == nil && l.GetCount() > 0 {
					return false
				}
				inUse, idle = inUse+l.GetInUse(), idle+l.GetCount()-l.GetInUse()
			}
			return ok(inUse, idle)
		})
	}
	shown := map[string]string{}
	show := func(name string, args ...string) {
		t.Helper()
		_, out, errOut := gov(t, args...)
		words := []string{"$ governor"}
		for _, a := range args {
			if strings.ContainsAny(a, " :") {
				a = shellQuote(a)
			}
			words = append(words, a)
		}
		shown[name] = strings.Join(words, " ") + "\n" + out + errOut
	}
	showTop := func(name string, want ...string) {
		t.Helper()
		s := startTop(t, srv.Addr(), govtest.AdminKey, "-root", "payments")
		shown[name] = "$ governor top -root payments\n" + s.waitFor(name, want...)
		s.quit()
	}

	// 1. Each worker ran two transactions at once and ended them: the
	// limit is full, and every slot sits idle in a sidecar's block.
	var open []*pgx.Conn
	for _, pod := range []string{"pod-a", "pod-b"} {
		for range 2 {
			open = append(open, beginTx(t, dial[pod]))
		}
	}
	held("four transactions holding a slot each", func(inUse, _ int64) bool { return inUse == 4 })
	for _, c := range open {
		sql(t, c, "COMMIT")
	}
	held("four idle slots", func(inUse, idle int64) bool { return inUse == 0 && idle == 4 })
	show("pool-doctor", "doctor", "-lease-age", "2s")
	showTop("pool-top", "db 4/4", "held: 4 delegated (0 in use, 4 idle)")
	show("pool-caps", "caps", "get", "payments")

	// 2. A transaction is left open on pod-a.
	stuck := beginTx(t, dial["pod-a"])
	in := held("one transaction holding a slot", func(inUse, idle int64) bool { return inUse == 1 && idle == 3 })
	var since time.Time
	for _, l := range in.GetLeases() {
		if l.GetInUse() > 0 {
			since = l.GetInUseSince().AsTime()
		}
	}
	<-time.After(time.Until(since.Add(2100 * time.Millisecond))) // past -lease-age
	show("stuck-doctor", "doctor", "-lease-age", "2s")
	showTop("stuck-top", "held: 4 delegated (1 in use, 3 idle)", "1 in use (for")
	show("stuck-caps", "caps", "get", "payments/pod-a")

	// 3. The tenant is suspended: new work is refused, the idle slots go
	// back, the open transaction keeps its slot (no -revoke).
	show("suspend", "tenant", "payments", "suspend", "-reason", "incident 42: runaway retries")
	held("the idle slots given back", func(inUse, idle int64) bool { return inUse == 1 && idle == 0 })
	show("suspended-doctor", "doctor", "-lease-age", "2s")
	showTop("suspended-top", "payments [suspended]", "state: suspended by admin", "1 in use (for")
	show("suspended-caps", "caps", "get", "payments")
	sql(t, stuck, "COMMIT")

	checkWalkthrough(t, walkthroughDoc, shown)
}

// beginTx connects to dsn and leaves a transaction open that has run a
// statement, so it holds its slot; the connection closes with the test.
func beginTx(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	sql(t, c, "BEGIN")
	sql(t, c, "SELECT 1")
	return c
}

func sql(t *testing.T, c *pgx.Conn, stmt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// walkBlock finds the block "<!-- walkthrough NAME -->" then ```text ...
// ```: name, and the text's start and end offsets.
var walkBlock = regexp.MustCompile("(?m)^<!-- walkthrough ([a-z-]+) -->\n```text\n((?s:.*?))^```\n")

// checkWalkthrough holds the document's blocks to what the commands
// printed (or, with -update-walkthrough, writes what they printed in).
func checkWalkthrough(t *testing.T, doc string, shown map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	found := map[string]bool{}
	var out strings.Builder
	last := 0
	for _, m := range walkBlock.FindAllStringSubmatchIndex(text, -1) {
		name, body := text[m[2]:m[3]], text[m[4]:m[5]]
		found[name] = true
		got, ok := shown[name]
		switch {
		case !ok:
			t.Errorf("%s shows %q, which the walk-through does not make", doc, name)
		case *updateWalkthrough:
			out.WriteString(text[last:m[4]])
			out.WriteString(tidy(got))
			last = m[5]
		case normalize(body) != normalize(got):
			t.Errorf("%s's %q is not what the command prints now (go test ./cmd/governor -run TestIncidentWalkthrough -update-walkthrough writes it in):\n--- the document\n%s--- the command\n%s",
				doc, name, body, tidy(got))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(shown)) {
		if !found[name] {
			t.Errorf("%s has no block <!-- walkthrough %s --> for:\n%s", doc, name, tidy(shown[name]))
		}
	}
	if *updateWalkthrough && !t.Failed() {
		out.WriteString(text[last:])
		if err := os.WriteFile(doc, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tidy is output as the document shows it: no space at the ends of lines,
// no run of blank lines (top's screen is mostly empty rows).
func tidy(s string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		l = strings.TrimRight(l, " ")
		if l == "" && len(lines) > 0 && lines[len(lines)-1] == "" {
			continue
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n") + "\n"
}

// What differs from one run to the next.
var (
	varTime     = regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d`)
	varAddr     = regexp.MustCompile(`127\.0\.0\.1:\d+`)
	varRate     = regexp.MustCompile(`\d+(\.\d+)?/s\b`)
	varDuration = regexp.MustCompile(`-?\d+(\.\d+)?(ms|µs|h|m|s)(\d+(\.\d+)?(ms|µs|h|m|s))*\b`)
	varSpace    = regexp.MustCompile(` +`)
)

// normalize is output with what differs from run to run put out of the
// comparison: times, addresses, rates, durations, the spaces that align
// columns, blank lines.
func normalize(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		l = varTime.ReplaceAllString(l, "TIME")
		l = varAddr.ReplaceAllString(l, "ADDR")
		l = varRate.ReplaceAllString(l, "RATE")
		l = varDuration.ReplaceAllString(l, "D")
		l = strings.TrimSpace(varSpace.ReplaceAllString(l, " "))
		if l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
