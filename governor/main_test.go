package governor_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestMain starts a real governord with the memory store for the tests and
// examples, and points GOVERNOR_ADDR and GOVERNOR_API_KEY at it, so the
// examples call governor.Dial(ctx) exactly as a program would. It fails the
// run if a goroutine is left behind once the server has stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(withServer{m}, goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"))
}

// The keys of govtest's configuration, under the names these tests use.
const (
	paymentsKey = govtest.TenantKey
	adminKey    = govtest.AdminKey
)

type withServer struct{ m *testing.M }

func (w withServer) Run() int {
	srv, err := govtest.StartMain(func(c *serverconfig.Config) {
		c.SessionTTL = 2 * time.Second
		c.Root = serverconfig.Caps{Limits: map[string]int64{"db": 4}}
		c.Tenants[0].Weight = 4
		c.Tenants[0].Defaults = serverconfig.Caps{Quotas: map[string]int64{"retry": 3}}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Close()
	os.Setenv(governor.EnvAddr, srv.Addr())
	os.Setenv(governor.EnvAPIKey, paymentsKey)
	os.Unsetenv(governor.EnvTLS)
	os.Unsetenv(governor.EnvCAFile)
	return w.m.Run()
}

// dialReal opens a session with the test's governord as the payments tenant
// and closes it when the test ends.
func dialReal(t *testing.T, opts ...governor.Option) *governor.Client {
	t.Helper()
	c, err := governor.Dial(t.Context(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newTask creates a task and closes it when the test ends.
func newTask(t *testing.T, ctx context.Context, c *governor.Client, spec governor.Spec) (context.Context, *governor.Task) {
	t.Helper()
	if spec.Name == "" {
		spec.Name = t.Name()
	}
	ctx, task, err := c.NewTask(ctx, spec)
	if err != nil {
		t.Fatalf("NewTask(%q): %v", spec.Name, err)
	}
	t.Cleanup(func() { task.Close() })
	return ctx, task
}
