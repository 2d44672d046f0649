package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestRequestIDAndJitter(t *testing.T) {
	a, b := RequestID(), RequestID()
	if len(a) != 32 || a == b {
		t.Fatalf("request ids %q and %q", a, b)
	}
	for range 1000 {
		if j := Jitter(time.Second); j < time.Second/2 || j > time.Second {
			t.Fatalf("Jitter(1s) = %v", j)
		}
	}
}

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		base, ceiling time.Duration
		n             int
		want          time.Duration // before jitter
	}{
		{25 * time.Millisecond, time.Second, 0, 25 * time.Millisecond},
		{25 * time.Millisecond, time.Second, 3, 200 * time.Millisecond},
		{25 * time.Millisecond, time.Second, 6, time.Second},
		{25 * time.Millisecond, time.Second, 1000, time.Second},
		{time.Hour, time.Second, 0, time.Second},
		{time.Minute, 100 * time.Hour, 62, 100 * time.Hour},
		{0, time.Second, 5, 0},
		{time.Millisecond, time.Second, -1, time.Millisecond},
	} {
		for range 100 {
			if d := Backoff(c.base, c.ceiling, c.n); d < c.want/2 || d > c.want {
				t.Fatalf("Backoff(%v, %v, %d) = %v, want in [%v, %v]", c.base, c.ceiling, c.n, d, c.want/2, c.want)
			}
		}
	}
}

func TestSleep(t *testing.T) {
	stopped := errors.New("stopped")
	if err := Sleep(context.Background(), time.Nanosecond); err != nil {
		t.Fatalf("Sleep(1ns) = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep with an ended ctx = %v, want context.Canceled", err)
	}
	stop := make(chan struct{})
	close(stop)
	if err := SleepUnless(context.Background(), time.Hour, stop, stopped); err != stopped {
		t.Fatalf("SleepUnless with a closed stop = %v, want %v", err, stopped)
	}
	if err := SleepUnless(context.Background(), time.Nanosecond, nil, stopped); err != nil {
		t.Fatalf("SleepUnless(1ns) with a nil stop = %v, want nil", err)
	}
}
