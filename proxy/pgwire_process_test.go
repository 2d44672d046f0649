package proxy

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The built governor-proxy binary, as an operator runs it, serving pgwire
// and HTTP with one session and one task; psql as the client. A quota of 3
// inserts lets exactly 3 through, the 4th is ERROR 53400 and the session
// goes on; SIGTERM stops the process with status 0 and no lease held.
func TestPGWireThroughTheBinaryWithPsql(t *testing.T) {
	up := pgUpstream(t)
	psql := filepath.Join(os.Getenv("GOVERNOR_TEST_PG_BIN"), "psql")
	if _, err := os.Stat(psql); err != nil {
		t.Skipf("no psql: %v", err)
	}
	freshPGTable(t, "pgq_psql")
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	dir := t.TempDir()
	bin := buildSidecar(t)
	httpAddr, metricsAddr, pgAddr := freePort(t), freePort(t), freePort(t)
	cfgPath := filepath.Join(dir, "proxy.yaml")
	must(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`governor: {addr: %q, api_key: %s}
task: {name: pod-bin, quotas: {db_writes: 4}}
http: {listen: %q, allow_targets: [localhost], shutdown_timeout: 5s}
metrics_listen: %q
pgwire:
  - {listen: %q, upstream: %q, task_from: application_name, wait_timeout: 5s}
rules:
  - {name: api, match: {host: 127.0.0.1}, class: api, charge: {db_writes: 1}}
  - {name: writes, match: {sql: [insert]}, class: db, charge: {db_writes: 1}}
`, g.Addr(), tenantKey, httpAddr, metricsAddr, pgAddr, up)), 0o600))
	cmd := exec.Command(bin, "-config", cfgPath, "-log-level", "debug")
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=")
	child := startChild(t, "governor-proxy", cmd)
	logs := child.logs
	eventually(t, "/readyz", func() bool {
		r, err := noProxyClient.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			return false
		}
		readAll(t, r)
		return r.StatusCode == 200
	})

	// One charge over HTTP, on the subtask psql names by application_name:
	// the quota of 4 leaves 3 inserts.
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("crawl-9", ""), Host: httpAddr}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: waitFor}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://127.0.0.1:" + port(o) + "/")
	must(t, err)
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("HTTP through the binary: %d", resp.StatusCode)
	}
	args := []string{"-X", "-At", "-v", "VERBOSITY=verbose", pgDSN(pgAddr, "crawl-9")}
	for i := 1; i <= 4; i++ {
		args = append(args, "-c", fmt.Sprintf("INSERT INTO pgq_psql VALUES (%d)", i))
	}
	args = append(args, "-c", "SELECT 41 + 1")
	out, err := exec.Command(psql, args...).CombinedOutput()
	text := string(out)
	if strings.Count(text, "INSERT 0 1") != 3 || !strings.Contains(text, "ERROR:  53400") ||
		!strings.Contains(text, "db_writes") || !strings.HasSuffix(strings.TrimSpace(text), "42") {
		t.Errorf("psql, a quota of 3 more inserts (err %v):\n%s", err, text)
	}
	if n := pgRows(t, "pgq_psql"); n != 3 {
		t.Errorf("rows: %d, want 3", n)
	}
	a := newAdmin(t, g.Addr())
	// The binary settles what it spent within settle_every (1s).
	eventually(t, "crawl-9's 4 db_writes to be settled", func() bool {
		return a.node("payments", "pod-bin", "crawl-9").GetUsed()["db_writes"] == 4
	})

	child.stop(t)
	if !strings.Contains(logs.String(), "governor-proxy stopped") {
		t.Errorf("no clean stop in the log")
	}
	if h := a.node("payments", "pod-bin").GetHeld()["db"]; h != 0 {
		t.Errorf("held after SIGTERM: %d", h)
	}
}
