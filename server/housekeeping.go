package server

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"time"
)

// Housekeeping is what governord does every second besides answering:
//
//   - it saves a snapshot once snapshot_every events have been committed
//     since the last;
//   - it rolls closed hours, days and months of usage up (rollups.go);
//   - it trims usage records older than usage_retention, as soon as
//     another minute of them is: records are kept by the minute;
//   - once ended tasks have been reclaimed in numbers (node_retention), it
//     saves a snapshot of what is left, so that neither the store nor the
//     memory store's copy in memory holds them any longer, and gives the
//     memory they took back to the operating system.
//
// Before, usage records were trimmed only with a snapshot, and a snapshot
// came only after snapshot_every events, so an idle governord kept its last
// busy minute, in its store and in its memory, for good (issue 25).

// reclaimedForSnapshot is how many fewer nodes than the last snapshot
// holds make one worth saving now, if that is at least half of them too:
// a snapshot costs about what it holds, so one of what is left after most
// was reclaimed is cheap, and it comes once per halving.
const reclaimedForSnapshot = 1000

// housekeeping returns the func to call every second. It runs on one
// goroutine, the only one that uses the mirror after start.
func (s *Server) housekeeping(ctx context.Context) func() {
	last := saved{seq: s.eng.Seq(), nodes: s.mirror.nodes()}
	trimmed := int64(math.MinInt64) // the minute trimmed before; none yet
	roll := &roller{s: s}
	return func() {
		now := s.cfg.Clock.Now()
		roll.rollUp(ctx, now) // before the trim: an hour is rolled while its minutes are kept
		// Minute records go once past usage_retention and rolled up.
		if before := roll.trimPoint(ctx, s.usageCutoff(now)); before > trimmed {
			s.trimUsage(ctx, before)
			trimmed = before // a failure is tried again with the next minute
		}
		s.flights.forgetAbandoned(time.Now()) // abandoned as the wall clock tells
		// Keep the mirror's queue short, and learn what it holds.
		if err := s.mirror.catchUp(s.eng); err != nil {
			s.log.Error("the snapshots' mirror of the engine", "err", err)
			return
		}
		committed := s.events.Committed()
		held := s.mirror.nodes()
		reclaimed := last.nodes - held
		shrank := reclaimed >= reclaimedForSnapshot && held <= last.nodes/2 && committed > last.seq
		why := "snapshot_every"
		switch {
		case committed >= last.seq+uint64(s.cfg.Store.SnapshotEvery):
		case shrank:
			why = "nodes reclaimed"
		default:
			return
		}
		snap, err := s.saveSnapshot(ctx, why)
		if err != nil {
			s.log.Error("snapshot failed; the events stay on record", "err", err)
			return
		}
		last = snap
		if shrank {
			s.returnMemory(reclaimed)
		}
	}
}

// returnMemory gives the heap that reclaimed nodes took back to the
// operating system now, with a collection and a scavenge: some
// milliseconds of CPU, paid once per halving of the nodes held. The
// runtime would give it back by itself only a little at a time, and only
// after a collection, which an idle governord, allocating nothing, does
// every two minutes.
func (s *Server) returnMemory(reclaimed int) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	began := time.Now()
	debug.FreeOSMemory()
	took := time.Since(began)
	runtime.ReadMemStats(&after)
	s.log.Info("memory returned to the OS after a reclaim", "nodes reclaimed", reclaimed,
		"heap in use before", before.HeapInuse, "heap in use", after.HeapInuse,
		"heap released", after.HeapReleased-before.HeapReleased, "took", took)
}
