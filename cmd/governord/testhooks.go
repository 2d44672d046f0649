package main

import (
	"os"

	"github.com/governor-project/governor/server/serverconfig"
)

// testIgnoreLeaseEnv plants a bug for the HA checker's own test (hacheck/): a
// leader that answers past its lease. Never set it in production.
const testIgnoreLeaseEnv = "GOVERNOR_TEST_HA_IGNORE_LEASE"

// testHooks returns the faults planted through the environment, or nil.
func testHooks() *serverconfig.HATestHooks {
	if os.Getenv(testIgnoreLeaseEnv) != "1" {
		return nil
	}
	return &serverconfig.HATestHooks{IgnoreLease: true}
}
