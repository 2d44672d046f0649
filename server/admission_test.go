package server

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/server/serverconfig"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeNow is a clock the test moves.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeNow) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeNow) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// queued waits until l has n calls waiting: a signal, not a sleep.
func queued(t *testing.T, a *admission, l *lane, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.mu.Lock()
		got := len(l.queue)
		a.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lane %q has %d calls queued, want %d", l.name, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// enterAsync enters l in the background; the ticket arrives on the channel.
func enterAsync(a *admission, l *lane) chan *ticket {
	ch := make(chan *ticket, 1)
	go func() {
		tk, err := a.enter(context.Background(), l)
		if err != nil {
			panic(err)
		}
		ch <- tk
	}()
	return ch
}

// With one place, lanes of weights 3 and 1 that both have calls waiting are
// served 3, 1, 3, 1, ...: each lane its weight in calls per turn, in the
// order configured, each lane's calls in the order they came.
func TestAdmissionWeightedRoundRobin(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1000, 0)}
	a := newAdmission(1, clock.now)
	la := a.addLane("a", laneLimits{Weight: 3, MaxInFlight: 10, MaxQueued: 100})
	lb := a.addLane("b", laneLimits{Weight: 1, MaxInFlight: 10, MaxQueued: 100})
	var order []string
	a.trace = func(what string, tk *ticket) {
		if what == traceAdmitted {
			order = append(order, tk.l.name)
		}
	}
	first, err := a.enter(context.Background(), la)
	if err != nil {
		t.Fatal(err)
	}
	var chans []chan *ticket
	for i := range 8 {
		chans = append(chans, enterAsync(a, la))
		queued(t, a, la, i+1)
	}
	for i := range 3 {
		chans = append(chans, enterAsync(a, lb))
		queued(t, a, lb, i+1)
	}
	first.finish()
	// Finish each call as it is admitted, until all have been.
	for done := 0; done < len(chans); {
		for _, ch := range chans {
			select {
			case tk := <-ch:
				tk.finish()
				done++
			default:
			}
		}
	}
	got := strings.Join(order, "")
	if want := "a" + "aaab" + "aaab" + "aab"; got != want {
		t.Fatalf("admitted in the order %s, want %s", got, want)
	}
}

// A lane alone uses every place its cap allows (work conserving); past
// its cap and its queue, a call is refused with RESOURCE_EXHAUSTED and a
// RetryInfo; a cancelled waiter leaves the queue.
func TestAdmissionCapQueueAndRefusal(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1000, 0)}
	a := newAdmission(8, clock.now)
	l := a.addLane("a", laneLimits{Weight: 1, MaxInFlight: 2, MaxQueued: 1})
	other := a.addLane("b", laneLimits{Weight: 1, MaxInFlight: 8, MaxQueued: 1})
	t1, err1 := a.enter(context.Background(), l)
	t2, err2 := a.enter(context.Background(), l)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { _, err := a.enter(ctx, l); waited <- err }()
	queued(t, a, l, 1)
	_, err := a.enter(context.Background(), l)
	var r *refusal
	if !errors.As(err, &r) || r.why != refusedBusy {
		t.Fatalf("a call past the cap and the queue: %v, want a refusal for busy", err)
	}
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || retryDelay(st) < minBusyWait || retryDelay(st) > maxBusyWait {
		t.Fatalf("refusal %v: want RESOURCE_EXHAUSTED with a RetryInfo in [%v, %v]", st, minBusyWait, maxBusyWait)
	}
	// Another tenant still gets in at once.
	tb, err := a.enter(context.Background(), other)
	if err != nil {
		t.Fatalf("the other tenant: %v", err)
	}
	tb.finish()
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v", err)
	}
	queued(t, a, l, 0)
	t1.finish()
	t1.finish() // a second finish gives back nothing more
	t2.finish()
	if st := a.stats(); st[0].inFlight != 0 || st[0].queued != 0 || a.used != 0 {
		t.Fatalf("after all finished: %+v, used %d", st, a.used)
	}
}

// api_rate refuses beyond its bucket with the time until the next token,
// and refills with the clock.
func TestAdmissionAPIRate(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1000, 0)}
	a := newAdmission(8, clock.now)
	l := a.addLane("a", laneLimits{Weight: 1, MaxInFlight: 8, MaxQueued: 8, Rate: &serverconfig.APIRate{PerSecond: 10, Burst: 2}})
	for range 2 {
		tk, err := a.enter(context.Background(), l)
		if err != nil {
			t.Fatal(err)
		}
		tk.finish()
	}
	_, err := a.enter(context.Background(), l)
	var r *refusal
	if !errors.As(err, &r) || r.why != refusedRate || r.retryAfter != 100*time.Millisecond {
		t.Fatalf("the third call at once: %v, want a refusal for api_rate with 100ms", err)
	}
	if d := retryDelay(status.Convert(err)); d != 100*time.Millisecond {
		t.Fatalf("RetryInfo %v, want 100ms", d)
	}
	clock.add(100 * time.Millisecond)
	tk, err := a.enter(context.Background(), l)
	if err != nil {
		t.Fatalf("after the wait: %v", err)
	}
	tk.finish()
	clock.add(-time.Hour) // a clock that goes back refills nothing
	if _, err := a.enter(context.Background(), l); !errors.As(err, &r) {
		t.Fatalf("after the clock went back: %v, want a refusal", err)
	}
}

func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return -1
}

func TestParseAPIRate(t *testing.T) {
	for text, want := range map[string]float64{"100/s": 100, "60/min": 1, "3600/h": 1, " 5 / s ": 5, "1000000/s": 1e6} {
		if got, err := serverconfig.ParseAPIRate(text); err != nil || got != want {
			t.Errorf("ParseAPIRate(%q) = %v, %v; want %v", text, got, err, want)
		}
	}
	for _, text := range []string{"", "100", "0/s", "-1/s", "1.5/s", "100/d", "1000001/s", "2147483648/s",
		"9007199254740992/s", "9223372036854775807/s", "9223372036854775808/s", "x/s", "/s", "1/"} {
		if got, err := serverconfig.ParseAPIRate(text); err == nil {
			t.Errorf("ParseAPIRate(%q) = %v, want an error", text, got)
		}
	}
}

// The admission keys: read with their defaults, and every hostile value a
// config error naming its key.
func TestConfigOfAdmissionKeys(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte(`
admission: {max_in_flight: 48, tenant_max_in_flight: 12, tenant_max_queued: 20, admin_weight: 2}
tenants:
  - {name: a, max_in_flight: 4, max_queued: 0, api_rate: 300/min, api_burst: 7}
  - {name: b, api_rate: 50/s}
  - {name: c}
`))
	if err != nil {
		t.Fatal(err)
	}
	if want := (serverconfig.AdmissionConfig{MaxInFlight: 48, TenantMaxInFlight: 12, TenantMaxQueued: 20, AdminWeight: 2}); cfg.Admission != want {
		t.Errorf("admission %+v, want %+v", cfg.Admission, want)
	}
	a, b, c := cfg.Tenants[0], cfg.Tenants[1], cfg.Tenants[2]
	if a.MaxInFlight != 4 || a.MaxQueued == nil || *a.MaxQueued != 0 || a.APIRate == nil || *a.APIRate != (serverconfig.APIRate{PerSecond: 5, Burst: 7}) {
		t.Errorf("tenant a: %d, %v, %+v", a.MaxInFlight, a.MaxQueued, a.APIRate)
	}
	if b.APIRate == nil || *b.APIRate != (serverconfig.APIRate{PerSecond: 50, Burst: 50}) || b.MaxInFlight != 0 || b.MaxQueued != nil {
		t.Errorf("tenant b: %d, %v, %+v", b.MaxInFlight, b.MaxQueued, b.APIRate)
	}
	if c.APIRate != nil || c.MaxInFlight != 0 || c.MaxQueued != nil {
		t.Errorf("tenant c: %d, %v, %+v", c.MaxInFlight, c.MaxQueued, c.APIRate)
	}
	def, err := serverconfig.ParseConfig([]byte("tenants: [{name: a}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (serverconfig.AdmissionConfig{MaxInFlight: serverconfig.DefaultMaxInFlight, TenantMaxInFlight: serverconfig.DefaultTenantMaxInFlight,
		TenantMaxQueued: serverconfig.DefaultTenantMaxQueued, AdminWeight: serverconfig.DefaultAdminWeight}); def.Admission != want {
		t.Errorf("defaults %+v, want %+v", def.Admission, want)
	}

	numbers := []string{"0", "-1", "2147483648", "9007199254740992", "9223372036854775807", "9223372036854775808", "many", "[1]", "{a: 1}", "1.5"}
	keys := []struct {
		key, yaml string
		zeroOK    bool
	}{
		{"admission.max_in_flight", "admission: {max_in_flight: %s}\n", false},
		{"admission.tenant_max_in_flight", "admission: {tenant_max_in_flight: %s}\n", false},
		{"admission.tenant_max_queued", "admission: {tenant_max_queued: %s}\n", true},
		{"admission.admin_weight", "admission: {admin_weight: %s}\n", false},
		{"tenants[0].max_in_flight", "tenants: [{name: a, max_in_flight: %s}]\n", false},
		{"tenants[0].max_queued", "tenants: [{name: a, max_queued: %s}]\n", true},
		{"tenants[0].api_burst", "tenants: [{name: a, api_rate: 10/s, api_burst: %s}]\n", false},
	}
	for _, k := range keys {
		for _, n := range numbers {
			if n == "0" && k.zeroOK {
				continue
			}
			text := strings.ReplaceAll(k.yaml, "%s", n)
			_, err := serverconfig.ParseConfig([]byte(text))
			// A key's own name, or its last part where the decoder names
			// the key without its path.
			last := k.key[strings.LastIndex(k.key, ".")+1:]
			if !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), last) {
				t.Errorf("%q: %v; want a config error naming %s", text, err, k.key)
			}
		}
	}
	for _, text := range []string{"0/s", "-5/s", "100", "2147483648/s", "9007199254740992/s", "9223372036854775807/s", "fast", "[1]", "10/d"} {
		cfg := "tenants: [{name: a, api_rate: \"" + text + "\"}]\n"
		if text == "[1]" {
			cfg = "tenants: [{name: a, api_rate: [1]}]\n"
		}
		if _, err := serverconfig.ParseConfig([]byte(cfg)); !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), "api_rate") {
			t.Errorf("%q: %v; want a config error naming tenants[0].api_rate", cfg, err)
		}
	}
	if _, err := serverconfig.ParseConfig([]byte("tenants: [{name: a, api_burst: 5}]\n")); !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), "tenants[0].api_burst") {
		t.Errorf("api_burst without api_rate: %v", err)
	}
}
