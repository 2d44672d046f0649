package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/governor-project/governor/internal/logline"
)

// startTimeout bounds how long a process may take to say it is ready. It is
// generous: the cores may be busy.
const startTimeout = time.Minute

// process is a program the driver started: its output, line by line, and
// its end.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited and its output is read

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed, and replaced, at each new line and at exit
}

// start runs bin with env as its whole environment. The kernel kills it if
// the driver dies, however the driver dies.
func start(name, bin string, env []string, args ...string) (*process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), changed: make(chan struct{})}
	go p.read(r)
	return p, nil
}

func (p *process) read(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	p.cmd.Wait()
	p.mu.Lock()
	close(p.changed)
	p.mu.Unlock()
	close(p.done)
}

// waitFor returns the fields of the process's first log line whose msg is
// msg, waiting for it as long as the process runs, up to within.
func (p *process) waitFor(ctx context.Context, msg string, within time.Duration) (map[string]any, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	seen := 0
	for {
		p.mu.Lock()
		lines, changed := p.lines[seen:], p.changed
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			if m := logline.Parse(l); m["msg"] == msg {
				return m, nil
			}
		}
		select {
		case <-changed:
			select {
			case <-p.done:
				// Lines may have come in with the exit: look once more.
				if m, ok := logline.Find(p.output(), msg); ok {
					return m, nil
				}
				return nil, fmt.Errorf("%s exited before %q: %s", p.name, msg, p.tail(10))
			default:
			}
		case <-timer.C:
			return nil, fmt.Errorf("%s: no %q within %v: %s", p.name, msg, within, p.tail(10))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func (p *process) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "\n" + strings.Join(p.lines[max(0, len(p.lines)-n):], "\n")
}

// stop asks the process to end (SIGTERM) and kills it if it has not
// within 15 seconds.
func (p *process) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// build compiles the example's programs and Governor's daemons from this
// module into dir, and returns their paths by name.
func build(ctx context.Context, root, dir string) (map[string]string, error) {
	pkgs := []string{"./cmd/governord", "./cmd/governor-proxy", "./examples/checkout/checkoutd", "./examples/checkout/nightly", "./examples/checkout/psp"}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	bins := map[string]string{}
	for _, p := range pkgs {
		bins[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// moduleRoot is the folder of this module's go.mod: the driver runs from a
// checkout of the repository.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", errors.New("run the example from a checkout of the governor repository (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// postgres is a throwaway PostgreSQL, started by scripts/testpg.sh in a
// shell that holds it until its stdin closes.
type postgres struct {
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{}
	dsn   string
}

// startPostgres sources scripts/testpg.sh (which installs PostgreSQL with
// apt-get where it is missing) in a shell that waits on its stdin. Closing
// stdin, or the driver's death, which closes it too, ends the shell, whose
// exit trap stops the server and removes its files.
func startPostgres(ctx context.Context, root string, log io.Writer) (*postgres, error) {
	cmd := exec.Command("bash", "-c", `source scripts/testpg.sh >&2 && echo "DSN $GOVERNOR_TEST_PG_DSN" && read -r _`)
	cmd.Dir = root
	cmd.Stderr = log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start scripts/testpg.sh: %w", err)
	}
	pg := &postgres{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if dsn, ok := strings.CutPrefix(sc.Text(), "DSN "); ok {
				lines <- dsn
			}
		}
		cmd.Wait()
		close(pg.done)
	}()
	select {
	case pg.dsn = <-lines:
		return pg, nil
	case <-pg.done:
		return nil, errors.New("scripts/testpg.sh could not start PostgreSQL (its messages are above)")
	case <-ctx.Done():
		pg.stop()
		return nil, ctx.Err()
	}
}

func (pg *postgres) stop() {
	pg.stdin.Close()
	<-pg.done
}

// pspHost picks the address the payment gateway listens on: one of this
// host's addresses other than loopback. Go's http.ProxyFromEnvironment
// never proxies a request to localhost or a loopback address, so a gateway
// on 127.0.0.1 would bypass HTTP_PROXY; a real gateway is on another host,
// and any non-loopback address stands for one.
func pspHost() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	var v6 string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || !ipn.IP.IsGlobalUnicast() {
			continue
		}
		if ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
		if v6 == "" {
			v6 = ipn.IP.String()
		}
	}
	if v6 != "" {
		return v6, nil
	}
	return "", errors.New("this host has no address but loopback, and Go's HTTP_PROXY support never proxies loopback targets: the example needs one (any interface that is up)")
}
