package faultproxy_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/faultproxy"
)

// echo serves a line echo on :0 until the test ends.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestBlackholeHoldsBytesUntilItEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(ln, echo(t))
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string) string {
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return "error: " + err.Error()
		}
		return line[:len(line)-1]
	}
	if got := roundTrip("one"); got != "one" {
		t.Fatalf("through the proxy: %q", got)
	}
	p.Blackhole(true)
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if got := roundTrip("two"); got == "two" {
		t.Fatal("bytes flowed through a blackhole")
	}
	p.Blackhole(false)
	c.SetReadDeadline(time.Time{})
	if line, err := r.ReadString('\n'); err != nil || line != "two\n" {
		t.Fatalf("after the blackhole: %q, %v", line, err)
	}
	p.Cut()
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("a cut connection still reads")
	}
}
