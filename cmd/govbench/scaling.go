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
	kind   simKind
	tenant int
	shard  int
}

type simKind int

// The simulation's events.
const (
	simArrival   simKind = iota // a tenant's acquire arrives at its shard
	simRelease                  // a held slot is given back
	simRebalance                // periodic blocks: shards give back and ask
	simReshuffle                // tenants' rates are dealt out again
	simAnswer                   // on demand: the coordinator's answer to a shard's ask
	simRecall                   // on demand: a recall reaches a shard
)

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
	m := newScalingSim(s)
	for m.q.Len() > 0 {
		e := heap.Pop(m.q).(simEvent)
		if e.at > s.Duration {
			break
		}
		m.advance(e.at)
		switch e.kind {
		case simArrival:
			i := m.shardOf(e.tenant)
			m.shards[i].waiting = append(m.shards[i].waiting, m.now)
			m.grant(i)
			m.ask(i)
			m.push(m.now+m.exp(m.rates[e.tenant]), simArrival, e.tenant, 0)
		case simRelease:
			m.shards[e.shard].held--
			m.held--
			m.grant(e.shard)
		case simRebalance:
			m.rebalance()
			m.push(m.now+s.Rebalance, simRebalance, 0, 0)
		case simAnswer:
			m.answer(e.shard)
		case simRecall:
			m.coordinator++
			sh := &m.shards[e.shard]
			if len(sh.waiting) == 0 {
				m.free += sh.block - sh.held
				sh.block = sh.held
			}
		case simReshuffle:
			m.deal()
			m.push(m.now+s.Reshuffle, simReshuffle, 0, 0)
		}
		m.check()
	}
	return m.result()
}

// reserve is the idle slots a shard keeps between rebalances.
const reserve = 1

// scalingSim is one run of the simulation.
type scalingSim struct {
	s       scalingSetup
	rng     *rand.Rand
	shards  []simShard
	free    int       // slots in no shard's block
	weights []float64 // Zipf weights, dealt to tenants at random
	total   float64
	rates   []float64 // each tenant's acquires per second
	q       *simQueue
	now     time.Duration
	held    int
	asking  []bool // on demand: shards with an ask in flight

	waits                  []time.Duration
	heldArea, strandedTime float64
	coordinator            int // calls to or from the coordinator
}

func newScalingSim(s scalingSetup) *scalingSim {
	m := &scalingSim{s: s, rng: rand.New(rand.NewPCG(s.Seed, uint64(s.Shards)*31+uint64(s.Policy))),
		shards: make([]simShard, s.Shards), free: s.Limit, weights: make([]float64, s.Tenants),
		rates: make([]float64, s.Tenants), q: &simQueue{}, asking: make([]bool, s.Shards)}
	switch {
	case s.Shards == 1:
		m.shards[0].block, m.free = s.Limit, 0
	case s.Policy == policyStatic:
		for i := range m.shards {
			m.shards[i].block = s.Limit / s.Shards
			m.free -= m.shards[i].block
		}
	}
	for i := range m.weights {
		m.weights[i] = 1 / float64(i+1)
		m.total += m.weights[i]
	}
	m.deal()
	for t := range s.Tenants {
		m.push(m.exp(m.rates[t]), simArrival, t, 0)
	}
	m.push(s.Reshuffle, simReshuffle, 0, 0)
	if s.Shards > 1 && (s.Policy == policyBlocks || s.Policy == policyOnDemand) {
		m.push(s.Rebalance, simRebalance, 0, 0)
	}
	return m
}

func (m *scalingSim) push(at time.Duration, kind simKind, tenant, shard int) {
	heap.Push(m.q, simEvent{at: at, kind: kind, tenant: tenant, shard: shard})
}

func (m *scalingSim) shardOf(tenant int) int { return tenant % m.s.Shards }

// deal deals the Zipf weights out to the tenants at random.
func (m *scalingSim) deal() {
	perm := m.rng.Perm(m.s.Tenants)
	offered := m.s.Load * float64(m.s.Limit) / m.s.Hold.Seconds()
	for i, t := range perm {
		m.rates[t] = offered * m.weights[i] / m.total
	}
}

func (m *scalingSim) exp(rate float64) time.Duration {
	return time.Duration(m.rng.ExpFloat64() / rate * float64(time.Second))
}

// advance moves the clock to at, adding up slots held and time stranded.
func (m *scalingSim) advance(at time.Duration) {
	dt := (at - m.now).Seconds()
	m.heldArea += float64(m.held) * dt
	if m.stranded() {
		m.strandedTime += dt
	}
	m.now = at
}

// stranded reports whether some shard has waiters while another has idle
// slots.
func (m *scalingSim) stranded() bool {
	want, idle := false, false
	for _, sh := range m.shards {
		want = want || len(sh.waiting) > 0
		idle = idle || sh.block > sh.held
	}
	return want && idle && m.s.Shards > 1
}

// check panics if the cap is broken: blocks and the free pool must sum to
// the limit, and no shard may hold more than its block.
func (m *scalingSim) check() {
	sum := m.free
	for _, sh := range m.shards {
		if sh.held > sh.block {
			panic("a shard holds more than its block")
		}
		sum += sh.block
	}
	if sum != m.s.Limit {
		panic(fmt.Sprintf("blocks and the free pool sum to %d, not the limit %d", sum, m.s.Limit))
	}
}

// grant serves shard i's queue from its block.
func (m *scalingSim) grant(i int) {
	sh := &m.shards[i]
	for len(sh.waiting) > 0 && sh.held < sh.block {
		m.waits = append(m.waits, m.now-sh.waiting[0])
		sh.waiting = sh.waiting[1:]
		sh.held++
		m.held++
		m.push(m.now+m.exp(1/m.s.Hold.Seconds()), simRelease, 0, i)
	}
}

// ask has shard i ask the coordinator for what its queue needs: the
// answer arrives an rtt later (policyOnDemand).
func (m *scalingSim) ask(i int) {
	if m.s.Policy == policyOnDemand && m.s.Shards > 1 && !m.asking[i] && len(m.shards[i].waiting) > m.shards[i].block-m.shards[i].held {
		m.asking[i] = true
		m.push(m.now+rtt, simAnswer, 0, i)
	}
}

// rebalance gives back idle slots above the reserve, then grants what the
// queues need from what is free, most waiting first (policyBlocks and
// policyOnDemand's periodic pass).
func (m *scalingSim) rebalance() {
	m.coordinator += len(m.shards)
	for i := range m.shards {
		sh := &m.shards[i]
		if idle := sh.block - sh.held - reserve; idle > 0 && len(sh.waiting) == 0 {
			sh.block -= idle
			m.free += idle
		}
	}
	order := make([]int, len(m.shards))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return len(m.shards[b].waiting) - len(m.shards[a].waiting) })
	for _, i := range order {
		sh := &m.shards[i]
		need := len(sh.waiting) - (sh.block - sh.held)
		if need <= 0 && sh.block-sh.held < reserve {
			need = reserve - (sh.block - sh.held)
		}
		n := min(max(need, 0), m.free)
		sh.block += n
		m.free -= n
		m.grant(i)
	}
}

// answer is the coordinator's answer to shard i's ask: it grants from what
// is free; if that is not enough it recalls idle slots from the others
// (contention: idle slots go back at once), and the shard asks again.
func (m *scalingSim) answer(i int) {
	m.coordinator++
	m.asking[i] = false
	sh := &m.shards[i]
	need := len(sh.waiting) - (sh.block - sh.held)
	n := min(max(need, 0), m.free)
	sh.block += n
	m.free -= n
	m.grant(i)
	if need > n {
		for j := range m.shards {
			if j != i && m.shards[j].block > m.shards[j].held {
				m.push(m.now+rtt, simRecall, 0, j)
			}
		}
		m.ask(i)
	}
}

// result sums the run up.
func (m *scalingSim) result() scalingResult {
	s, waits := m.s, m.waits
	r := scalingResult{Acquires: len(waits), Utilisation: m.heldArea / (float64(s.Limit) * s.Duration.Seconds()),
		Stranded: m.strandedTime / s.Duration.Seconds(), CoordinatorCalls: float64(m.coordinator) / s.Duration.Seconds()}
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
