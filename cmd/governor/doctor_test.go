package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/server/serverconfig"
	"google.golang.org/protobuf/types/known/durationpb"
)

type doctorDoc struct {
	OK       bool
	Findings []finding
}

func runDoctorCLI(t *testing.T, args ...string) (int, doctorDoc, string) {
	t.Helper()
	code, out, errOut := cli(t, append([]string{"doctor", "-json"}, args...)...)
	var doc doctorDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("doctor -json: %v\n%s%s", err, out, errOut)
	}
	return code, doc, out
}

// has reports whether doc holds a finding of check at level whose subject
// and problem contain the strings given.
func has(doc doctorDoc, check, level string, parts ...string) bool {
	for _, f := range doc.Findings {
		if f.Check != check || f.Level != level {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(f.Subject+" "+f.Problem+" fix: "+f.Fix, p)
		}
		if all {
			return true
		}
	}
	return false
}

// Every tree check is triggered on purpose against a real governord: a
// child's cap above its parent's, a cap an ancestor keeps out of reach, a
// cap of zero, a tenant near its quota, a lease held too long, a session
// whose heartbeats are late and a waiter queued past wait_timeout; and a
// healthy tree passes.
func TestDoctorTree(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root = serverconfig.Caps{Limits: map[string]int64{"db": 10}} })
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if code, doc, out := runDoctorCLI(t); code != 0 || !doc.OK {
		t.Fatalf("a healthy governord: exit %d\n%s", code, out)
	}

	ctx := context.Background()
	admin := adminRPC(t, srv.Addr())
	mk := func(parent int64, name string, quotas, limits map[string]int64) int64 {
		t.Helper()
		n, err := admin.CreateNode(ctx, &governorpb.CreateNodeRequest{ParentId: parent,
			Spec: &governorpb.NodeSpec{Name: name, Quotas: quotas, Limits: limits}})
		if err != nil {
			t.Fatal(err)
		}
		return n.GetId()
	}
	if _, err := admin.SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: 2, Quotas: map[string]int64{"tokens": 100}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	far := mk(2, "far", nil, map[string]int64{"db": 20})
	mk(2, "zero", map[string]int64{"tokens": 0}, nil)
	parent := mk(2, "parent", map[string]int64{"tokens": 10}, nil)
	mk(parent, "child", map[string]int64{"tokens": 50}, nil)
	pool := mk(2, "pool", nil, map[string]int64{"db": 1})
	metered, err := admin.CreateNode(ctx, &governorpb.CreateNodeRequest{ParentId: 2, Spec: &governorpb.NodeSpec{Name: "metered",
		Rates: map[string]*governorpb.Rate{"calls": {Units: 1, Per: durationpb.New(time.Hour)}}}})
	if err != nil {
		t.Fatal(err)
	}

	tenant, err := governor.Dial(ctx, governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey))
	if err != nil {
		t.Fatal(err)
	}
	defer tenant.Close()
	trpc := tenant.Raw()
	if _, err := trpc.Consume(ctx, &governorpb.ConsumeRequest{NodeId: far, Resource: "tokens", Amount: 95}); err != nil {
		t.Fatal(err)
	}
	if _, err := trpc.Acquire(ctx, &governorpb.AcquireRequest{NodeId: pool, Class: "db"}); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancelWait := context.WithCancel(ctx)
	defer cancelWait()
	go trpc.Acquire(waitCtx, &governorpb.AcquireRequest{NodeId: pool, Class: "db"}) //nolint:errcheck // it waits until cancelled
	// A charge waiting for a rate: the bucket's one call is spent.
	if _, err := trpc.Consume(ctx, &governorpb.ConsumeRequest{NodeId: metered.GetId(), Resource: "calls", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	go trpc.ChargeAndAcquire(waitCtx, &governorpb.ChargeAndAcquireRequest{NodeId: metered.GetId(), //nolint:errcheck // it waits until cancelled
		Charges: map[string]int64{"calls": 1}, WaitForRate: true})
	// A session that opened and never heartbeats.
	if _, err := admin.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: govtest.TenantKey, Ttl: durationpb.New(4 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	for { // the waiters are queued: governord says so
		in, err := admin.Inspect(ctx, &governorpb.InspectRequest{NodeId: 1})
		if err != nil {
			t.Fatal(err)
		}
		if in.GetWaiterCount() == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling governord's answer
	}
	<-time.After(time.Until(opened.Add(1500 * time.Millisecond))) // a third of the TTL passes without a heartbeat

	code, doc, out := runDoctorCLI(t, "-lease-age", "1ms", "-wait-timeout", "1ms", "-heartbeat-grace", "0", "-near-quota", "0.9")
	if code != 1 || doc.OK {
		t.Fatalf("doctor on a tree with problems: exit %d, ok %v", code, doc.OK)
	}
	for _, want := range []struct {
		check, level string
		parts        []string
	}{
		{"caps", "warn", []string{"payments/parent/child", "quota tokens 50 is above its parent payments/parent's 10"}},
		{"caps", "warn", []string{"payments/far", "limit db 20 can never be met: its ancestor / caps it at 10"}},
		{"caps", "warn", []string{"payments/zero", "quota tokens is 0: it admits nothing"}},
		{"quota", "warn", []string{"payments", "quota tokens is 95/100 used (95%)"}},
		{"leases", "warn", []string{"payments/pool", "of db held by session"}},
		{"waiters", "warn", []string{"payments/pool", "an acquire of db by session", "longer than wait_timeout 1ms", "fix: the pool is full"}},
		{"waiters", "warn", []string{"payments/metered", "a charge by session", "waiting for the rate of calls", "longer than wait_timeout 1ms",
			"fix: the rate binds: raise the rate of calls"}},
		{"heartbeats", "warn", []string{"(payments)", "last heartbeat"}},
		{"clock", "ok", nil},
		{"connectivity", "ok", nil},
	} {
		if !has(doc, want.check, want.level, want.parts...) {
			t.Errorf("no %s %s finding with %q:\n%s", want.level, want.check, want.parts, out)
		}
	}
	// The text form says how to fix each.
	_, text, _ := cli(t, "doctor", "-lease-age", "1ms")
	if !strings.Contains(text, "fix: ") || !strings.Contains(text, "problem(s) found") {
		t.Errorf("doctor's text output:\n%s", text)
	}
}

// The config files are linted with every finding at once: a governord
// config that does not load, rules an earlier rule shadows, a class no
// limit names, a resource no quota caps; each pgwire upstream is dialled;
// governord unreachable is an error; all exit 1.
func TestDoctorLint(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := down.Addr().String()
	down.Close() // nothing listens there now
	tmpl, err := os.ReadFile("testdata/doctor-proxy.yaml.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	proxy := filepath.Join(t.TempDir(), "proxy.yaml")
	text := strings.NewReplacer(`"UP"`, up.Addr().String(), `"DOWN"`, downAddr).Replace(string(tmpl))
	if err := os.WriteFile(proxy, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOVERNOR_ADDR", downAddr)
	t.Setenv("GOVERNOR_API_KEY", "any")
	code, doc, out := runDoctorCLI(t, "-config", "testdata/doctor-governord.yaml", "-proxy-config", proxy, "-timeout", "300ms")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []struct {
		check, level string
		parts        []string
	}{
		{"config", "ok", []string{"doctor-governord.yaml", "loads"}},
		{"rules", "warn", []string{`rule 2 "chat"`, `can never match: rule 1 "all-posts"`}},
		{"rules", "warn", []string{`rule 5 "payment-inserts"`, `can never match: rule 4 "any-sql"`}},
		{"rules", "warn", []string{`class "batch"`, "no limit names it"}},
		{"rules", "warn", []string{`resource "untracked"`, "no quota caps it"}},
		{"pgwire", "ok", []string{up.Addr().String(), "reachable"}},
		{"pgwire", "error", []string{downAddr, "cannot be reached"}},
		{"connectivity", "error", []string{downAddr}},
	} {
		if !has(doc, want.check, want.level, want.parts...) {
			t.Errorf("no %s %s finding with %q:\n%s", want.level, want.check, want.parts, out)
		}
	}
	for _, f := range doc.Findings {
		if f.Level == "warn" && f.Check == "rules" && (strings.Contains(f.Subject, "all-posts") || strings.Contains(f.Subject, `"llm"`) ||
			strings.Contains(f.Subject, `"db"`) || strings.Contains(f.Subject, "llm_calls") || strings.Contains(f.Subject, "any-sql")) {
			t.Errorf("a finding about what is fine: %+v", f)
		}
	}
	code, doc, out = runDoctorCLI(t, "-config", "testdata/doctor-governord-bad.yaml", "-timeout", "300ms")
	if code != 1 || !has(doc, "config", "error", "store.driver") {
		t.Errorf("a governord config that does not load: exit %d\n%s", code, out)
	}
	if code, _, _ := cli(t, "doctor", "-near-quota", "2"); code != 2 {
		t.Errorf("bad flags: exit %d, want 2", code)
	}
}

func TestDoctorClockAndTransport(t *testing.T) {
	sent := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recv := sent.Add(100 * time.Millisecond)
	if f := skewFinding(sent, recv, sent.Add(50*time.Millisecond+3*time.Second), 2*time.Second); f.Level != levelWarn || !strings.Contains(f.Problem, "3s off") {
		t.Errorf("a clock 3s ahead: %+v", f)
	}
	if f := skewFinding(sent, recv, sent.Add(-1*time.Second), 2*time.Second); f.Level != levelOK {
		t.Errorf("a clock 1.05s behind, within 2s: %+v", f)
	}
	t.Setenv("GOVERNOR_TLS", "")
	t.Setenv("GOVERNOR_CA_FILE", "")
	if fs := checkTransport("10.1.2.3:7600", time.Hour); len(fs) != 1 || fs[0].Level != levelWarn || !strings.Contains(fs[0].Problem, "plaintext to another host") {
		t.Errorf("plaintext to 10.1.2.3: %+v", fs)
	}
	if fs := checkTransport("127.0.0.1:7600,[::1]:7600", time.Hour); len(fs) != 1 || fs[0].Level != levelOK {
		t.Errorf("plaintext on loopback: %+v", fs)
	}
}

// With TLS on, doctor shakes hands with governord: a certificate about to
// expire is a finding, and one the CA file does not trust is an error.
func TestDoctorTLS(t *testing.T) {
	cert := testcert.New(t, "127.0.0.1")
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.TLS = serverconfig.TLSConfig{CertFile: cert.CertFile, KeyFile: cert.KeyFile}
	})
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	t.Setenv("GOVERNOR_CA_FILE", cert.CertFile)
	code, doc, out := runDoctorCLI(t)
	if code != 1 || !has(doc, "tls", "warn", "governord's certificate expires in") || !has(doc, "connectivity", "ok") {
		t.Fatalf("a certificate valid for an hour: exit %d\n%s", code, out)
	}
	if code, doc, out := runDoctorCLI(t, "-cert-warn", "1m"); code != 0 || !has(doc, "tls", "ok", "certificate valid until") {
		t.Fatalf("the same, warned a minute before: exit %d\n%s", code, out)
	}
	other := testcert.New(t, "127.0.0.1")
	t.Setenv("GOVERNOR_CA_FILE", other.CertFile)
	if code, doc, out := runDoctorCLI(t, "-timeout", "500ms"); code != 1 || !has(doc, "tls", "error", "the TLS handshake failed") {
		t.Fatalf("a CA file that does not trust governord: exit %d\n%s", code, out)
	}
}

// The rules lint reads the caps in force when governord can be asked: a
// quota set live with caps set (not in governord's file) counts, and the
// findings say which caps they were checked against; with governord out of
// reach it falls back to the file, and says so.
func TestDoctorLintReadsLiveCaps(t *testing.T) {
	dir := t.TempDir()
	gcfg := filepath.Join(dir, "governord.yaml")
	if err := os.WriteFile(gcfg, []byte("listen: 127.0.0.1:7600\nstore: {driver: memory}\nroot: {limits: {db: 10}}\n"+
		"tenants:\n  - {name: payments, api_key: pay-key}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	proxy := filepath.Join(dir, "proxy.yaml")
	if err := os.WriteFile(proxy, []byte("governor: {addr: 127.0.0.1:7600}\ntask: {name: pod-a}\n"+
		"rules:\n  - {name: writes, match: {sql: [insert, update, delete]}, class: db, charge: {db_writes: 1}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root = serverconfig.Caps{Limits: map[string]int64{"db": 10}} })
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	code, out, errOut := gov(t, "doctor", "-config", gcfg, "-proxy-config", proxy)
	if code != 1 || !strings.Contains(out, `WARN  rules        `+proxy+`: resource "db_writes": rules writes charge it, but no quota caps it in the caps governord has now`) {
		t.Errorf("doctor before the live cap: exit %d, want the uncapped resource found in the live caps\n%s%s", code, out, errOut)
	}
	if code, out, errOut := gov(t, "caps", "set", "payments", "quota.db_writes=1000", "-reason", "cap the writes"); code != 0 {
		t.Fatalf("caps set: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = gov(t, "doctor", "-config", gcfg, "-proxy-config", proxy)
	if code != 0 || strings.Contains(out, "no quota caps it") ||
		!strings.Contains(out, "OK    rules        "+proxy+": every class its rules hold has a limit and every resource they charge a quota, in the caps governord has now") {
		t.Fatalf("doctor after caps set quota.db_writes: exit %d\n%s%s", code, out, errOut)
	}
	// A tenant's key sees its tenant and below (not the root's limit of
	// db), and says so.
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	_, out, _ = gov(t, "doctor", "-proxy-config", proxy)
	if !strings.Contains(out, `class "db": rules writes hold leases of it, but no limit names it in the caps governord has now, on payments and below (the caps above are outside this key's scope)`) ||
		strings.Contains(out, `resource "db_writes"`) {
		t.Fatalf("doctor with a tenant's key does not say what it saw:\n%s", out)
	}
	// governord away: the file's caps, said as such.
	srv.Close()
	code, out, _ = gov(t, "doctor", "-config", gcfg, "-proxy-config", proxy, "-timeout", "300ms")
	if code != 1 || !strings.Contains(out, `resource "db_writes": rules writes charge it, but no quota caps it in the caps in governord's config file (governord was not reached)`) {
		t.Fatalf("doctor with governord away: exit %d\n%s", code, out)
	}
}

// Each configuration given to the other's flag: the doctor says which
// flag the file belongs to, not only that its keys are unknown (the
// example files, as a new operator would pass them).
func TestDoctorNamesTheFlagOfAConfigGivenToTheOther(t *testing.T) {
	t.Setenv("GOVERNOR_ADMIN_KEY", "admin")
	t.Setenv("PAYMENTS_KEY", "pay")
	t.Setenv("RECON_KEY", "recon")
	for _, c := range []struct{ flag, file, fix string }{
		{"-config", "../../proxy.example.yaml", "this is governor-proxy's configuration: lint it with -proxy-config ../../proxy.example.yaml"},
		{"-proxy-config", "../../governor.example.yaml", "this is governord's configuration: lint it with -config ../../governor.example.yaml"},
	} {
		code, doc, out := runDoctorCLI(t, c.flag, c.file, "-timeout", "200ms")
		found := false
		for _, f := range doc.Findings {
			if f.Check == "config" && f.Level == levelError && strings.HasPrefix(f.Fix, c.fix) {
				found = true
			}
		}
		if code != 1 || !found {
			t.Errorf("doctor %s %s: exit %d, want a config error whose fix starts %q\n%s", c.flag, c.file, code, c.fix, out)
		}
	}
	// A file that is neither keeps the plain advice.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("listne: 127.0.0.1:7600\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, doc, _ := runDoctorCLI(t, "-config", bad, "-timeout", "200ms")
	if len(doc.Findings) == 0 || doc.Findings[0].Fix != "correct the key named; governord refuses to start with this file" {
		t.Errorf("a file with a typo: %+v", doc.Findings)
	}
}
