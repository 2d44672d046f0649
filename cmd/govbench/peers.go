package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// The peers of the sidecar scenario: the proxies users run today, from
// Debian's packages, each started in a folder of its own inside the run's
// temporary folder with a generated config, on a port chosen from :0, and
// stopped with the run. pgbouncer is in procs.go.

// squidConfig is Squid as a plain forward proxy: nothing cached, nothing
// logged per request, no headers added, so that it relays and no more.
const squidConfig = `http_port 127.0.0.1:%[1]s
http_access allow all
cache deny all
cache_mem 0 MB
access_log none
cache_store_log none
cache_log %[2]s/cache.log
pid_filename %[2]s/squid.pid
coredump_dir %[2]s
netdb_filename none
pinger_enable off
via off
forwarded_for delete
shutdown_lifetime 0 seconds
cache_effective_user %[3]s
`

// startSquid starts Squid in the foreground (-N) and returns its address.
// As root, Squid drops to cache_effective_user itself.
func startSquid(dir string) (*proc, string, error) {
	bin, err := lookSbin("squid")
	if err != nil {
		return nil, "", err
	}
	owner := "proxy"
	if os.Getuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return nil, "", err
		}
		owner = u.Username
	}
	return startPeer(dir, "squid", func(sdir, port string) (*exec.Cmd, error) {
		cfg := filepath.Join(sdir, "squid.conf")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(squidConfig, port, sdir, owner)), 0o644); err != nil {
			return nil, err
		}
		return exec.Command(bin, "-N", "-f", cfg), nil
	})
}

// tinyproxyConfig is tinyproxy as a plain forward proxy, logging only
// what is critical, to its standard error.
const tinyproxyConfig = `Port %[1]s
Listen 127.0.0.1
Timeout 600
MaxClients 1024
LogLevel Critical
PidFile "%[2]s/tinyproxy.pid"
Allow 127.0.0.1
DisableViaHeader Yes
`

// startTinyproxy starts tinyproxy in the foreground (-d), as nobody when
// this is root, and returns its address.
func startTinyproxy(dir string) (*proc, string, error) {
	bin, err := lookSbin("tinyproxy")
	if err != nil {
		return nil, "", err
	}
	return startPeer(dir, "tinyproxy", func(tdir, port string) (*exec.Cmd, error) {
		text := fmt.Sprintf(tinyproxyConfig, port, tdir)
		if os.Getuid() == 0 {
			text += "User nobody\nGroup nogroup\n"
		}
		cfg := filepath.Join(tdir, "tinyproxy.conf")
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			return nil, err
		}
		return exec.Command(bin, "-d", "-c", cfg), nil
	})
}

// startPeer makes name's folder (writable by the user a peer drops to),
// picks its port, starts the command cmdFor returns, and waits until the
// port accepts.
func startPeer(dir, name string, cmdFor func(pdir, port string) (*exec.Cmd, error)) (*proc, string, error) {
	port, err := pickPort()
	if err != nil {
		return nil, "", err
	}
	pdir := filepath.Join(dir, name)
	if err := os.MkdirAll(pdir, 0o777); err != nil {
		return nil, "", err
	}
	if err := os.Chmod(pdir, 0o777); err != nil {
		return nil, "", err
	}
	cmd, err := cmdFor(pdir, port)
	if err != nil {
		return nil, "", err
	}
	p, err := start(name, cmd)
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + port
	if err := waitAccepting(p, addr, 20*time.Second); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addr, nil
}

// pickPort is a port that was free a moment ago, for the programs that
// cannot listen on :0 and say which port they got. Another process could
// take it in between; on a benchmark machine none does.
func pickPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port, nil
}

// waitAccepting polls addr until it accepts a connection, p exits, or
// within passes.
func waitAccepting(p *proc, addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited:\n%s", p.name, lastLines(p.logText(), 10))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never listened on %s:\n%s", p.name, addr, lastLines(p.logText(), 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lookSbin finds a program on PATH or in /usr/sbin, where Debian puts
// daemons that PATH often lacks.
func lookSbin(name string) (string, error) {
	if bin, err := exec.LookPath(name); err == nil {
		return bin, nil
	}
	bin := filepath.Join("/usr/sbin", name)
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("%s is not installed", name)
	}
	return bin, nil
}

// asUser runs cmd as the named user (for daemons that refuse root).
func asUser(cmd *exec.Cmd, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	return nil
}
