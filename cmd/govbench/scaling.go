package main

// The scaling scenario (docs/scaling.md): a simulation, on a virtual clock,
// of tenants sharded across several leaders whose root pool is split by
// delegated blocks, against one leader holding the whole pool.
//
//	go run ./cmd/govbench scaling [-seed 1] [-hours 1]
//
// Each tenant's work arrives as a Poisson stream of acquires of one class
// (a slot held for an exponentially distributed time); tenants' rates follow
// a Zipf law, and every few minutes the rates are dealt out again, so the
// load moves between shards. The root limit L is the cap: at every instant
// the slots held plus the slots delegated but idle, over all shards, are at
// most L (checked at every step).
//
// Policies for the pool:
//
//   - one: one leader, the whole pool (today's governord);
//   - static: each of S shards holds L/S for good;
//   - blocks: each shard holds a block from the root's coordinator; every
//     rebalance interval a shard gives back idle slots above a small reserve
//     and asks for what its queue needs, granted from what is free;
//   - on demand: as the sidecars' delegated blocks work, a shard with a
//     waiter it cannot serve asks the coordinator at once (an rtt there and
//     back); what is free is granted, and when that is not enough the
//     coordinator recalls idle slots from the other shards (contention
//     sends idle slots back at once), and the shard asks again; idle slots
//     above a reserve also go back every rebalance interval.
//
// It reports, per policy: the share of acquires that waited over 10ms, the mean and
// p99 wait, the pool's utilisation, and stranding: the time a shard had
// waiters while another shard held idle slots.

import (
	"container/heap"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

func scalingMain(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("scaling", stderr)
	seed := fs.Uint64("seed", 1, "the simulation's seed")
	hours := fs.Float64("hours", 1, "simulated hours per run")
	if fs.Parse(args) != nil {
		return 2
	}
	base := scalingSetup{Limit: 40, Tenants: 200, Load: 0.8, Hold: 2 * time.Second, Reshuffle: 5 * time.Minute,
		Duration: time.Duration(*hours * float64(time.Hour)), Seed: *seed}
	fmt.Fprintf(stdout, "scaling: root limit %d, %d tenants (Zipf rates, re-dealt every %v), offered load %.0f%% of the limit, hold %v, %v simulated\n",
		base.Limit, base.Tenants, base.Reshuffle, base.Load*100, base.Hold, base.Duration)
	fmt.Fprintf(stdout, "  %-28s %8s %10s %10s %8s %10s %12s\n", "policy", ">10ms", "mean wait", "p99 wait", "util", "stranded", "coord. /s")
	show := func(name string, s scalingSetup) {
		r := simulateScaling(s)
		fmt.Fprintf(stdout, "  %-28s %7.1f%% %10v %10v %7.1f%% %9.1f%% %12.1f\n", name, r.WaitedShare*100,
			r.MeanWait.Round(time.Millisecond), r.P99Wait.Round(time.Millisecond), r.Utilisation*100, r.Stranded*100, r.CoordinatorCalls)
	}
	one := base
	one.Shards = 1
	show("one leader", one)
	for _, shards := range []int{2, 4, 8} {
		s := base
		s.Shards = shards
		s.Policy = policyStatic
		show(fmt.Sprintf("%d shards, static L/S", shards), s)
		for _, every := range []time.Duration{100 * time.Millisecond, time.Second} {
			s.Policy, s.Rebalance = policyBlocks, every
			show(fmt.Sprintf("%d shards, blocks every %v", shards, every), s)
		}
		s.Policy, s.Rebalance = policyOnDemand, time.Second
		show(fmt.Sprintf("%d shards, blocks on demand", shards), s)
	}
	return 0
}

type scalingPolicy int

const (
	policyStatic scalingPolicy = iota
	policyBlocks
	policyOnDemand
)

// rtt is the time a shard's request to the root's coordinator takes, there
// and back (one commit there included).
const rtt = 2 * time.Millisecond

type scalingSetup struct {
	Limit     int
	Tenants   int
	Shards    int
	Policy    scalingPolicy
	Rebalance time.Duration // blocks: how often shards give back and ask
	Load      float64       // offered load as a share of the limit
	Hold      time.Duration // mean time a slot is held
	Reshuffle time.Duration // how often tenants' rates are dealt out again
	Duration  time.Duration
	Seed      uint64
}

// waitedOver is the wait that counts as waiting: longer than a few round
// trips to a coordinator.
const waitedOver = 10 * time.Millisecond

type scalingResult struct {
	WaitedShare       float64
	MeanWait, P99Wait time.Duration
	Utilisation       float64 // slot-seconds held / (limit × duration)
	Stranded          float64 // share of time some shard had waiters while another had idle slots
	Acquires          int
	// CoordinatorCalls is how often, per second, shards asked the root's
	// coordinator or gave slots back to it: the load sharding moves onto it.
	CoordinatorCalls float64
}

// simulation events, on the virtual clock.
type simEvent struct {
	at     time.Duration
	kind   int // 0 arrival, 1 release, 2 rebalance, 3 reshuffle, 4 ask, 5 recall
	tenant int
	shard  int
}

type simQueue []simEvent

func (q simQueue) Len() int           { return len(q) }
func (q simQueue) Less(i, j int) bool { return q[i].at < q[j].at }
func (q simQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)        { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simShard struct {
	block, held int
	waiting     []time.Duration // arrival times of queued acquires
}

// simulateScaling runs one setup. It panics if the cap is ever broken.
func simulateScaling(s scalingSetup) scalingResult {
	rng := rand.New(rand.NewPCG(s.Seed, uint64(s.Shards)*31+uint64(s.Policy)))
	shards := make([]simShard, s.Shards)
	free := s.Limit
	switch {
	case s.Shards == 1:
		shards[0].block, free = s.Limit, 0
	case s.Policy == policyStatic:
		for i := range shards {
			shards[i].block = s.Limit / s.Shards
			free -= shards[i].block
		}
	}
	shardOf := func(tenant int) int { return tenant % s.Shards }
	// Zipf weights, dealt to tenants at random and re-dealt on reshuffle.
	weights := make([]float64, s.Tenants)
	var total float64
	for i := range weights {
		weights[i] = 1 / float64(i+1)
		total += weights[i]
	}
	rates := make([]float64, s.Tenants) // acquires per second
	deal := func() {
		perm := rng.Perm(s.Tenants)
		offered := s.Load * float64(s.Limit) / s.Hold.Seconds()
		for i, t := range perm {
			rates[t] = offered * weights[i] / total
		}
	}
	deal()
	q := &simQueue{}
	exp := func(rate float64) time.Duration { return time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) }
	for t := range s.Tenants {
		heap.Push(q, simEvent{at: exp(rates[t]), kind: 0, tenant: t})
	}
	heap.Push(q, simEvent{at: s.Reshuffle, kind: 3})
	if s.Shards > 1 && (s.Policy == policyBlocks || s.Policy == policyOnDemand) {
		heap.Push(q, simEvent{at: s.Rebalance, kind: 2})
	}
	var waits []time.Duration
	var heldArea, strandedTime float64
	now := time.Duration(0)
	held := 0
	stranded := func() bool {
		want, idle := false, false
		for _, sh := range shards {
			want = want || len(sh.waiting) > 0
			idle = idle || sh.block > sh.held
		}
		return want && idle && s.Shards > 1
	}
	check := func() {
		sum := free
		for _, sh := range shards {
			if sh.held > sh.block {
				panic("a shard holds more than its block")
			}
			sum += sh.block
		}
		if sum != s.Limit {
			panic(fmt.Sprintf("blocks and the free pool sum to %d, not the limit %d", sum, s.Limit))
		}
	}
	grant := func(i int) {
		sh := &shards[i]
		for len(sh.waiting) > 0 && sh.held < sh.block {
			waits = append(waits, now-sh.waiting[0])
			sh.waiting = sh.waiting[1:]
			sh.held++
			held++
			heap.Push(q, simEvent{at: now + exp(1/s.Hold.Seconds()), kind: 1, shard: i})
		}
	}
	const reserve = 1 // idle slots a shard keeps between rebalances
	coordinator := 0
	asking := make([]bool, s.Shards)
	// ask has shard i ask the coordinator for what its queue needs: the
	// answer arrives an rtt later (policyOnDemand).
	ask := func(i int) {
		if s.Policy == policyOnDemand && s.Shards > 1 && !asking[i] && len(shards[i].waiting) > shards[i].block-shards[i].held {
			asking[i] = true
			heap.Push(q, simEvent{at: now + rtt, kind: 4, shard: i})
		}
	}
	for q.Len() > 0 {
		e := heap.Pop(q).(simEvent)
		if e.at > s.Duration {
			break
		}
		dt := (e.at - now).Seconds()
		heldArea += float64(held) * dt
		if stranded() {
			strandedTime += dt
		}
		now = e.at
		switch e.kind {
		case 0:
			i := shardOf(e.tenant)
			shards[i].waiting = append(shards[i].waiting, now)
			grant(i)
			ask(i)
			heap.Push(q, simEvent{at: now + exp(rates[e.tenant]), kind: 0, tenant: e.tenant})
		case 1:
			shards[e.shard].held--
			held--
			grant(e.shard)
		case 2:
			// Give back idle slots above the reserve, then grant what the
			// queues need from what is free, most waiting first.
			coordinator += len(shards)
			for i := range shards {
				sh := &shards[i]
				if idle := sh.block - sh.held - reserve; idle > 0 && len(sh.waiting) == 0 {
					sh.block -= idle
					free += idle
				}
			}
			order := make([]int, len(shards))
			for i := range order {
				order[i] = i
			}
			slices.SortFunc(order, func(a, b int) int { return len(shards[b].waiting) - len(shards[a].waiting) })
			for _, i := range order {
				sh := &shards[i]
				need := len(sh.waiting) - (sh.block - sh.held)
				if need <= 0 && sh.block-sh.held < reserve {
					need = reserve - (sh.block - sh.held)
				}
				n := min(max(need, 0), free)
				sh.block += n
				free -= n
				grant(i)
			}
			heap.Push(q, simEvent{at: now + s.Rebalance, kind: 2})
		case 4:
			coordinator++
			// The coordinator grants from what is free; if that is not
			// enough it recalls idle slots from the others (contention:
			// idle slots go back at once), and the shard asks again.
			asking[e.shard] = false
			sh := &shards[e.shard]
			need := len(sh.waiting) - (sh.block - sh.held)
			n := min(max(need, 0), free)
			sh.block += n
			free -= n
			grant(e.shard)
			if need > n {
				for j := range shards {
					if j != e.shard && shards[j].block > shards[j].held {
						heap.Push(q, simEvent{at: now + rtt, kind: 5, shard: j})
					}
				}
				ask(e.shard)
			}
		case 5:
			coordinator++
			sh := &shards[e.shard]
			if len(sh.waiting) == 0 {
				free += sh.block - sh.held
				sh.block = sh.held
			}
		case 3:
			deal()
			heap.Push(q, simEvent{at: now + s.Reshuffle, kind: 3})
		}
		check()
	}
	r := scalingResult{Acquires: len(waits), Utilisation: heldArea / (float64(s.Limit) * s.Duration.Seconds()),
		Stranded: strandedTime / s.Duration.Seconds(), CoordinatorCalls: float64(coordinator) / s.Duration.Seconds()}
	slices.Sort(waits)
	var sum time.Duration
	waited := 0
	for _, w := range waits {
		sum += w
		if w > waitedOver {
			waited++
		}
	}
	if len(waits) > 0 {
		r.WaitedShare = float64(waited) / float64(len(waits))
		r.MeanWait = sum / time.Duration(len(waits))
		r.P99Wait = waits[int(math.Ceil(0.99*float64(len(waits))))-1]
	}
	return r
}
