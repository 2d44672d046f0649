package main

import (
	"testing"
	"time"
)

// TestScalingSimulation runs every policy of the scaling simulation briefly:
// the cap holds at every step (simulateScaling panics otherwise), and the
// figures docs/scaling.md rests on point the way it says: blocks on demand
// strand far less than a static split and wait far less.
func TestScalingSimulation(t *testing.T) {
	base := scalingSetup{Limit: 40, Tenants: 100, Load: 0.8, Hold: 2 * time.Second, Reshuffle: time.Minute,
		Duration: 5 * time.Minute, Seed: 1, Shards: 4}
	static, onDemand := base, base
	static.Policy = policyStatic
	onDemand.Policy, onDemand.Rebalance = policyOnDemand, time.Second
	periodic := onDemand
	periodic.Policy = policyBlocks
	rs, ro := simulateScaling(static), simulateScaling(onDemand)
	simulateScaling(periodic)
	if ro.Acquires == 0 || rs.Acquires == 0 {
		t.Fatal("no acquires simulated")
	}
	if ro.Stranded >= rs.Stranded/4 || ro.MeanWait >= rs.MeanWait/4 {
		t.Fatalf("blocks on demand: stranded %.1f%%, mean wait %v; static: %.1f%%, %v", ro.Stranded*100, ro.MeanWait, rs.Stranded*100, rs.MeanWait)
	}
}
