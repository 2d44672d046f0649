package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The ungoverned targets of the sidecar scenario, side by side with the
// sidecar: the proxies users run (Squid, tinyproxy, pgbouncer; peers.go)
// and the floors (floors.go), and CPU profiles of any target under load.

// peer is an ungoverned process the runs measure.
type peer struct {
	*proc
	addr string
}

// httpPeerNames are the ungoverned HTTP targets in the order they run and
// print: bare goproxy, then the floors, then the peers.
var httpPeerNames = []string{"goproxy", "nethttp", "fasthttp", "squid", "tinyproxy"}

// startHTTPPeers starts every ungoverned HTTP target. A peer that is not
// installed is left out, and said so; anything else that fails to start
// fails the run.
func (b *sidecarBench) startHTTPPeers() error {
	for _, name := range httpPeerNames {
		var (
			p    *proc
			addr string
			err  error
		)
		switch name {
		case "squid":
			p, addr, err = startSquid(b.dir)
		case "tinyproxy":
			p, addr, err = startTinyproxy(b.dir)
		default:
			p, addr, err = startSelf("serve-" + name)
		}
		if err != nil && strings.Contains(err.Error(), "is not installed") {
			b.printf("govbench: no %s target: %v\n", name, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		b.later(p.stop)
		b.httpPeers[name] = &peer{proc: p, addr: addr}
	}
	return nil
}

// startRelayFloors adds the TCP relay floors in front of PostgreSQL to
// the pgwire targets.
func (b *sidecarBench) startRelayFloors() error {
	for _, f := range []struct{ name, core, procs string }{
		{"relay-copy", "copy", "0"}, {"relay-gnet", "gnet", "0"}, {"relay-gnet-p1", "gnet", "1"},
	} {
		p, addr, err := startSelf("serve-relay", "-core", f.core, "-procs", f.procs, "-upstream", "127.0.0.1:"+b.pgPort)
		if err != nil {
			return fmt.Errorf("start %s: %w", f.name, err)
		}
		b.later(p.stop)
		b.pgTargets = append(b.pgTargets, pgTarget{name: f.name, port: portOf(addr), cpu: p.cpu, pid: p.cmd.Process.Pid})
	}
	return nil
}

// httpPID is the process behind an HTTP target's name (0: none).
func (b *sidecarBench) httpPID(name string) int {
	if p := b.httpPeers[name]; p != nil {
		return p.cmd.Process.Pid
	}
	if s := b.httpTargets[name]; s != nil {
		return s.cmd.Process.Pid
	}
	return 0
}

// profileAll records a CPU profile of each named target with perf, which
// sees any process the same way, Go or C, the kernel's share included. A
// name is http:NAME (under wrk with 1 connection) or pg:NAME (under
// pgbench -S with 8 clients); a bare name is looked up as HTTP first.
// Each profile goes to dir as KIND-NAME.perf.data and its report as
// KIND-NAME.txt; the top of each is printed.
func (b *sidecarBench) profileAll(dir string, names []string) error {
	if _, err := exec.LookPath("perf"); err != nil {
		return fmt.Errorf("-profile needs perf (Debian's linux-perf): %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, target := range names {
		kind, name, ok := strings.Cut(strings.TrimSpace(target), ":")
		if !ok {
			kind, name = "http", kind
			if b.httpPID(name) == 0 {
				kind = "pg"
			}
		}
		pid, load := 0, func() {}
		switch kind {
		case "http":
			pid, load = b.httpPID(name), func() { b.wrkRun(b.originAddr, b.httpAddr(name), 1) }
		case "pg":
			for _, t := range b.pgTargets {
				if t.name == name {
					pid, load = t.pid, func() { b.pgbenchRun(t.port, 8) }
				}
			}
		}
		if pid == 0 {
			b.printf("govbench: no target %q to profile\n", target)
			continue
		}
		if err := b.profile(dir, kind+"-"+name, pid, load); err != nil {
			return err
		}
	}
	return nil
}

// profile records pid's CPU while load runs, and reports it.
func (b *sidecarBench) profile(dir, name string, pid int, load func()) error {
	data := filepath.Join(dir, name+".perf.data")
	rec := exec.Command("perf", "record", "-q", "-e", "cpu-clock", "-F", "999", "-g", "-p", strconv.Itoa(pid), "-o", data,
		"--", "sleep", strconv.Itoa(b.seconds))
	var out strings.Builder
	rec.Stdout, rec.Stderr = &out, &out
	if err := rec.Start(); err != nil {
		return fmt.Errorf("perf record %s: %w", name, err)
	}
	// perf writes its file's header once it is attached: the load starts
	// then, so that the profile covers it.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st, err := os.Stat(data); err == nil && st.Size() > 0 {
			break
		}
	}
	load()
	if err := rec.Wait(); err != nil {
		return fmt.Errorf("perf record %s: %v: %s", name, err, lastLines(out.String(), 3))
	}
	var report strings.Builder
	for _, sortBy := range []string{"dso", "sym"} {
		out, err := exec.Command("perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
			"--percent-limit", "0.5", "--sort", sortBy).CombinedOutput()
		if err != nil {
			return fmt.Errorf("perf report %s: %v: %s", name, err, lastLines(string(out), 3))
		}
		report.Write(out)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".txt"), []byte(report.String()), 0o644); err != nil {
		return err
	}
	b.printf("profile of %s (perf, %ds; %s):\n%s\n", name, b.seconds, filepath.Join(dir, name+".txt"), topLines(report.String(), 12))
	return nil
}

// topLines is a perf report's first n lines of figures per table.
func topLines(report string, n int) string {
	var out []string
	left := 0
	for _, line := range strings.Split(report, "\n") {
		switch {
		case strings.HasPrefix(line, "# Overhead"):
			out, left = append(out, line), n
		case left > 0 && strings.Contains(line, "%") && !strings.HasPrefix(line, "#"):
			out, left = append(out, line), left-1
		}
	}
	return strings.Join(out, "\n")
}
