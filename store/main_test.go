package store_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any test leaves a goroutine behind: the Log's
// writer, a pool's health checker or a database/sql opener.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
