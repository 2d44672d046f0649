package top

import (
	"testing"
	"time"
)

// Ages read as slots.Age prints them, and in days from two days on.
func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                  "0s",
		0:                             "0s",
		59 * time.Second:              "59s",
		61 * time.Second:              "1m01s",
		2*time.Hour + 5*time.Minute:   "2h05m",
		47*time.Hour + 59*time.Minute: "47h59m",
		48 * time.Hour:                "2d",
		100 * time.Hour:               "4d",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
