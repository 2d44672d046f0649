package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/governor-project/governor/internal/logline"
)

// proc is a process a scenario started: its log, its CPU time, its end.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  strings.Builder
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func start(name string, cmd *exec.Cmd) (*proc, error) {
	dieWithUs(cmd)
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p, p
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop ends the process (SIGTERM, then SIGKILL).
func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu is the process's user and system time so far.
func (p *proc) cpu() time.Duration { return cpuOf(p.cmd.Process.Pid) }

// cpuOf reads a process's user and system time from /proc.
func cpuOf(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command may hold spaces: the fields that follow come after ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// logLine waits for the process's log line whose msg is msg (JSON or
// slog's text format) and returns its fields.
func (p *proc) logLine(msg string, within time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if m, ok := logline.Find(p.logText(), msg); ok {
			return m, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited:\n%s", p.name, lastLines(p.logText(), 10))
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("%s: no %q in its log within %v:\n%s", p.name, msg, within, lastLines(p.logText(), 10))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// binaries builds governord and governor-proxy from this module into dir.
func binaries(dir string) (governord, proxy string, err error) {
	root, err := moduleRoot()
	if err != nil {
		return "", "", err
	}
	governord, proxy = filepath.Join(dir, "governord"), filepath.Join(dir, "governor-proxy")
	for bin, pkg := range map[string]string{governord: "./cmd/governord", proxy: "./cmd/governor-proxy"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return governord, proxy, nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return "", errors.New("run govbench from a checkout of the governor module (go env GOMOD is empty)")
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// daemon is a governord or governor-proxy process and its addresses.
type daemon struct {
	*proc
	addr, metrics, pg string
}

// startGovernord starts governord on yaml (listen addresses are added) and
// waits until it serves.
func startGovernord(bin, dir, name, yaml string) (*daemon, error) {
	cfg := filepath.Join(dir, name+".yaml")
	text := "listen: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\n" + yaml
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		return nil, err
	}
	p, err := start(name, exec.Command(bin, "-config", cfg))
	if err != nil {
		return nil, err
	}
	line, err := p.logLine("governord ready", 30*time.Second)
	if err != nil {
		p.stop()
		return nil, err
	}
	return &daemon{proc: p, addr: fmt.Sprint(line["listen"]), metrics: fmt.Sprint(line["metrics"])}, nil
}

// startSidecar starts governor-proxy with yaml (its HTTP and metrics
// listeners on :0 are added) and waits until it is ready. The origins the
// scenarios use listen on loopback, which the proxy refuses as a target
// unless its config allows it.
func startSidecar(bin, dir, name, yaml string) (*daemon, error) {
	return startSidecarHTTP(bin, dir, name, "{listen: 127.0.0.1:0, allow_targets: [localhost]}", yaml)
}

// startSidecarHTTP is startSidecar with its http: block given.
func startSidecarHTTP(bin, dir, name, httpBlock, yaml string) (*daemon, error) {
	cfg := filepath.Join(dir, name+".yaml")
	text := "http: " + httpBlock + "\nmetrics_listen: 127.0.0.1:0\n" + yaml
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-config", cfg)
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=")
	p, err := start(name, cmd)
	if err != nil {
		return nil, err
	}
	line, err := p.logLine("governor-proxy listening", 30*time.Second)
	if err != nil {
		p.stop()
		return nil, err
	}
	d := &daemon{proc: p, addr: fmt.Sprint(line["http"]), metrics: fmt.Sprint(line["metrics"])}
	if pg, ok := line["pgwire"].([]any); ok && len(pg) > 0 {
		d.pg = fmt.Sprint(pg[0])
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := http.Get("http://" + d.metrics + "/readyz")
		if err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return d, nil
			}
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s never got ready:\n%s", name, lastLines(p.logText(), 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startSelf starts this binary in one of its hidden serving modes and reads
// the address it prints.
func startSelf(mode string, args ...string) (*proc, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(self, append([]string{mode}, args...)...)
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	dieWithUs(cmd)
	p := &proc{name: mode, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = p
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	go func() { cmd.Wait(); close(p.done) }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		p.stop()
		return nil, "", fmt.Errorf("%s: %v", mode, err)
	}
	go io.Copy(io.Discard, out)
	return p, strings.TrimSpace(line), nil
}

// serveOrigin is the origin of the HTTP runs: 1 KiB per response, after an
// optional delay. It prints its address.
func serveOrigin(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("serve-origin", stderr)
	delay := fs.Duration("delay", 0, "how long each response waits")
	size := fs.Int("size", 1024, "response bytes")
	certFile := fs.String("tls-cert", "", "serve HTTPS with this certificate (PEM), on 127.0.0.1 to 127.0.0.N for each of its IP addresses")
	keyFile := fs.String("tls-key", "", "the certificate's key (PEM)")
	h2 := fs.Bool("h2", false, "with -tls-cert: offer HTTP/2 in ALPN (otherwise HTTP/1.1 only)")
	if fs.Parse(args) != nil {
		return 2
	}
	body := strings.Repeat("x", *size)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if *delay > 0 {
			time.Sleep(*delay)
		}
		io.WriteString(w, body)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *certFile == "" {
		fmt.Fprintln(stdout, ln.Addr())
		return serveUntilKilled(ln, h, stderr)
	}
	return serveOriginTLS(ln, h, *certFile, *keyFile, *h2, stdout, stderr)
}

// serveOriginTLS serves h over TLS on ln, and on the same port of every
// other loopback address the certificate names, so that each is a host of
// its own to a proxy.
func serveOriginTLS(ln net.Listener, h http.Handler, certFile, keyFile string, h2 bool, stdout, stderr io.Writer) int {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	if !h2 {
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	for _, ip := range leaf.IPAddresses {
		if ip.Equal(net.IPv4(127, 0, 0, 1)) {
			continue
		}
		more, err := net.Listen("tcp", net.JoinHostPort(ip.String(), port))
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		go srv.ServeTLS(more, "", "")
	}
	fmt.Fprintln(stdout, ln.Addr())
	if err := srv.ServeTLS(ln, "", ""); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// serveGoproxy is bare goproxy, as the baseline: no governance. It prints
// its address.
func serveGoproxy(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("serve-goproxy", stderr)
	mitmCert := fs.String("mitm-cert", "", "do MITM for every CONNECT with this CA (PEM; intercept.go)")
	mitmKey := fs.String("mitm-key", "", "the MITM CA's key")
	upstreamCA := fs.String("upstream-ca", "", "with -mitm-cert: the CA to verify upstreams with")
	if fs.Parse(args) != nil {
		return 2
	}
	if *mitmCert != "" {
		return serveGoproxyMITM(*mitmCert, *mitmKey, *upstreamCA, stdout, stderr)
	}
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = log.New(io.Discard, "", 0)
	gp.Tr = &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 256}
	ln, ok := listenAnnounced(stdout, stderr)
	if !ok {
		return 1
	}
	return serveUntilKilled(ln, gp, stderr)
}

// listenAnnounced listens on a port of loopback chosen by the system and
// prints its address on stdout, which is how the benchmark that started
// this process learns where it serves.
func listenAnnounced(stdout, stderr io.Writer) (net.Listener, bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, false
	}
	fmt.Fprintln(stdout, ln.Addr())
	return ln, true
}

func serveUntilKilled(ln net.Listener, h http.Handler, stderr io.Writer) int {
	if err := (&http.Server{Handler: h}).Serve(ln); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// pgbouncerConfig is pgbouncer in session mode in front of the server on
// pgPort, trusting the benchmark's user.
const pgbouncerConfig = `[databases]
governor = host=127.0.0.1 port=%[1]s dbname=governor
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[2]s
auth_type = trust
auth_file = %[3]s/users.txt
pool_mode = session
max_client_conn = 400
default_pool_size = 200
unix_socket_dir =
`

// startPgbouncer starts pgbouncer in session mode in front of the server
// on pgPort, as the postgres user when this is root (pgbouncer refuses to
// run as root), and returns its port.
func startPgbouncer(dir, pgPort string) (*proc, string, error) {
	bin, err := lookSbin("pgbouncer")
	if err != nil {
		return nil, "", err
	}
	p, addr, err := startPeer(dir, "pgbouncer", func(bdir, port string) (*exec.Cmd, error) {
		ini := fmt.Sprintf(pgbouncerConfig, pgPort, port, bdir)
		for name, text := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"governor" "governor"` + "\n"} {
			if err := os.WriteFile(filepath.Join(bdir, name), []byte(text), 0o644); err != nil {
				return nil, err
			}
		}
		cmd := exec.Command(bin, filepath.Join(bdir, "pgbouncer.ini"))
		if os.Getuid() == 0 {
			if err := asUser(cmd, "postgres"); err != nil {
				return nil, fmt.Errorf("pgbouncer refuses root, and there is no postgres user: %w", err)
			}
		}
		return cmd, nil
	})
	if err != nil {
		return nil, "", err
	}
	return p, portOf(addr), nil
}

// dieWithUs has the kernel kill the process when govbench dies, however it
// dies, so that no daemon of a run outlives it.
func dieWithUs(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
