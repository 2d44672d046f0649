package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
)

// tmuxSession runs the governor binary in a detached tmux of its own.
type tmuxSession struct {
	t      *testing.T
	socket string
}

func (s tmuxSession) run(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", s.socket}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (s tmuxSession) screen() string { return s.run("capture-pane", "-p", "-t", "top") }

// waitFor polls the screen until it holds every string in want.
func (s tmuxSession) waitFor(what string, want ...string) string {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		screen := s.screen()
		all := true
		for _, w := range want {
			all = all && strings.Contains(screen, w)
		}
		if all {
			return screen
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: the screen never showed %q:\n%s", what, want, screen)
		}
		time.Sleep(50 * time.Millisecond) // polling the terminal's contents
	}
}

// needTmux skips t when tmux is not installed, unless GOVERNOR_TEST_TMUX=1
// asks for the test (test.sh installs tmux and sets it).
func needTmux(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		if os.Getenv("GOVERNOR_TEST_TMUX") == "1" {
			t.Fatal("tmux is not installed")
		}
		t.Skip("tmux is not installed")
	}
}

// startTop runs the built governor top with args in a detached tmux of its
// own, 150 by 45, against addr with key; the session ends with the test.
func startTop(t *testing.T, addr, key string, args ...string) tmuxSession {
	t.Helper()
	needTmux(t)
	bin := buildCLI(t)
	s := tmuxSession{t: t, socket: "governor-top-test-" + filepath.Base(t.TempDir())}
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", s.socket, "kill-server").Run() })
	s.run(append([]string{"new-session", "-d", "-s", "top", "-x", "150", "-y", "45",
		"env", "GOVERNOR_ADDR=" + addr, "GOVERNOR_API_KEY=" + key, "TERM=xterm-256color", bin, "top"}, args...)...)
	return s
}

// quit quits top and waits until it has exited (its tmux session ends
// with it), so that its session with governord is closed.
func (s tmuxSession) quit() {
	s.t.Helper()
	s.run("send-keys", "-t", "top", "q")
	deadline := time.Now().Add(30 * time.Second)
	for exec.Command("tmux", "-L", s.socket, "has-session", "-t", "top").Run() == nil {
		if time.Now().After(deadline) {
			s.t.Fatalf("top did not exit on q:\n%s", s.screen())
		}
		time.Sleep(20 * time.Millisecond) // polling tmux
	}
}

// governor top in a real terminal against a real governord: the tree
// shows, the keys move the selection, a cap is edited live (with a reason,
// audited as the admin's), and when governord goes away the screen says so.
// tmux must be installed (test.sh installs it); without it the test skips
// unless GOVERNOR_TEST_TMUX=1 asks for it.
func TestTopInTmux(t *testing.T) {
	needTmux(t)
	srv := govtest.Start(t, nil)
	admin := adminRPC(t, srv.Addr())
	ctx := context.Background()
	task, err := admin.CreateNode(ctx, &governorpb.CreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "crawl", Quotas: map[string]int64{"tokens": 100}, Limits: map[string]int64{"db": 4},
			Rates: map[string]*governorpb.Rate{"pages": {Units: 5, Per: durationpb.New(time.Hour)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Consume(ctx, &governorpb.ConsumeRequest{NodeId: task.GetId(), Resource: "tokens", Amount: 30}); err != nil {
		t.Fatal(err)
	}

	s := startTop(t, srv.Addr(), govtest.AdminKey)
	s.waitFor("the tree", "governor top", "root", "payments", "crawl", "tokens 30/100", "db 0/4")
	s.run("send-keys", "-t", "top", "Down", "Down")
	if _, err := admin.Consume(ctx, &governorpb.ConsumeRequest{NodeId: task.GetId(), Resource: "pages", Amount: 2}); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the selection and its rate", "payments/crawl  (id", "rates (left/burst): pages 3/5 (5/h, full in")
	s.run("send-keys", "-t", "top", "e")
	s.waitFor("the cap prompt", "set a cap on payments/crawl")
	s.run("send-keys", "-t", "top", "-l", "quota.tokens=777")
	s.run("send-keys", "-t", "top", "Enter")
	s.waitFor("the reason prompt", "reason for quota.tokens=777")
	s.run("send-keys", "-t", "top", "-l", "tmux edit")
	s.run("send-keys", "-t", "top", "Enter")
	s.waitFor("the confirmation", `set quota.tokens on payments/crawl: 100 -> 777, because "tmux edit"? [y/n]`)
	s.run("send-keys", "-t", "top", "y")
	s.waitFor("the edit", `100 -> 777 (audited: "tmux edit")`, "tokens 30/777")

	h, err := admin.GetCapsHistory(ctx, &governorpb.GetCapsHistoryRequest{NodeId: task.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(h.GetChanges()); n != 1 || h.GetChanges()[0].GetWho() != "admin" || h.GetChanges()[0].GetReason() != "tmux edit" ||
		h.GetChanges()[0].GetNew().GetQuotas()["tokens"] != 777 || h.GetChanges()[0].GetOld().GetQuotas()["tokens"] != 100 {
		t.Fatalf("the audit trail after the edit in top: %v", h.GetChanges())
	}

	// governord goes away: the screen says so and keeps the last figures.
	srv.Close()
	s.waitFor("the banner", "governord unreachable", "retrying every 1s", "tokens 30/777")
	s.run("send-keys", "-t", "top", "q")
}
