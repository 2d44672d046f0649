package engine

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// EndReason says how a lease or a session ended.
type EndReason uint8

const (
	EndReleased EndReason = iota + 1 // released by its holder, or its session was closed
	EndExpired                       // its session's TTL passed
	EndRevoked                       // its node ended
)

func (r EndReason) String() string {
	switch r {
	case EndReleased:
		return "released"
	case EndExpired:
		return "expired"
	case EndRevoked:
		return "revoked"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

type session struct {
	id      SessionID
	scope   *node
	token   string // SHA-256 of the session token, hex
	ttl     time.Duration
	expires int64 // not state: heartbeats move it and are not recorded

	leases       map[LeaseID]*lease
	blocks       map[blockKey]*lease // its blocks, also in leases
	reservations map[resKey]*reservation
	slices       map[resKey]*slice // its slices of rates (slice.go)
	waiters      []*waiter
	requests     requestMemory
}

func (s *session) expired(now int64) bool { return s.id != System && now >= s.expires }

// expiry is when a session renewed at now with ttl expires: at the clock's
// last instant when a TTL reaches past it, rather than wrapped into the past.
func expiry(now int64, ttl time.Duration) int64 {
	if int64(ttl) > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + int64(ttl)
}

// OpenSession opens a session scoped to the node scope. tokenHash is the
// SHA-256 of the token the server handed out; the engine never sees tokens.
func (e *Engine) OpenSession(scope NodeID, tokenHash string, ttl time.Duration) (SessionID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	if ttl <= 0 {
		return 0, invalid("session TTL %v is not positive", ttl)
	}
	if _, taken := e.byToken[tokenHash]; taken && tokenHash != "" {
		return 0, invalid("session token already in use")
	}
	n := e.nodes[scope]
	if n == nil {
		return 0, fmt.Errorf("%w: node %d", ErrNotFound, scope)
	}
	if err := e.checkOpen(n, now); err != nil {
		return 0, err
	}
	if err := e.checkNewSession(n.tenant); err != nil {
		return 0, err
	}
	id := e.nextSession
	e.emit(Event{Kind: EvSessionOpened, At: now, Session: id, Node: scope, Token: tokenHash, Amount: int64(ttl)})
	return id, nil
}

// RenewAll gives every session one fresh TTL from now. A server calls it
// when it starts serving after a replay, so the time the replay took does
// not count against sessions whose heartbeats it could not receive.
func (e *Engine) RenewAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	for _, s := range e.sessions {
		s.expires = expiry(now, s.ttl)
	}
}

// SessionByToken finds the open session whose token hashes to tokenHash.
func (e *Engine) SessionByToken(tokenHash string) (id SessionID, scope NodeID, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.byToken[tokenHash]
	if s == nil {
		return 0, 0, false
	}
	return s.id, s.scope.id, true
}

// SessionTokens returns the token hash of every open session but System's.
func (e *Engine) SessionTokens() map[SessionID]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[SessionID]string, len(e.sessions))
	for id, s := range e.sessions {
		if id != System {
			out[id] = s.token
		}
	}
	return out
}

// Heartbeat renews a session for one more TTL and returns the TTL.
func (e *Engine) Heartbeat(sid SessionID) (time.Duration, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return 0, err
	}
	if s.id != System {
		s.expires = expiry(now, s.ttl)
	}
	return s.ttl, nil
}

// CloseSession ends a session: its leases are released and its waiters fail.
func (e *Engine) CloseSession(sid SessionID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return err
	}
	if s.id == System {
		return invalid("the system session cannot be closed")
	}
	e.endSession(s, now, EndReleased)
	return nil
}

func (e *Engine) endSession(s *session, now int64, why EndReason) {
	e.emit(Event{Kind: EvSessionEnded, At: now, Session: s.id, Reason: why})
	err := fmt.Errorf("%w: session %d expired", ErrSessionExpired, s.id)
	if why != EndExpired {
		err = fmt.Errorf("%w: session %d was closed", ErrUnauthenticated, s.id)
	}
	for _, w := range slices.Clone(s.waiters) {
		e.failWaiter(w, err)
	}
	e.dispatchAll()
}

func (e *Engine) applySessionEnded(s *session, ev *Event) {
	reason := EndReleased
	if ev.Reason == EndExpired {
		reason = EndExpired
	}
	for _, id := range sortedKeys(s.leases) {
		e.endLease(s.leases[id], reason, ev.At)
	}
	e.spendReservations(s)
	e.endSlices(s, ev.At)
	s.scope.unpinSession()
	delete(e.sessions, s.id)
	if s.token != "" {
		delete(e.byToken, s.token)
	}
}

// session resolves sid, ending it on the spot when its TTL has passed.
func (e *Engine) session(sid SessionID, now int64) (*session, error) {
	if sid == System {
		return e.system, nil
	}
	s := e.sessions[sid]
	if s == nil {
		return nil, fmt.Errorf("%w: no session %d", ErrUnauthenticated, sid)
	}
	if s.expired(now) {
		e.endSession(s, now, EndExpired)
		return nil, fmt.Errorf("%w: session %d", ErrSessionExpired, sid)
	}
	return s, nil
}

// target resolves a node for s. It is the one scope check every operation
// goes through. A node outside the scope is not found, in the same words
// as one that does not exist, so that its existence stays hidden.
func (e *Engine) target(s *session, id NodeID) (*node, error) {
	n := e.nodes[id]
	if n == nil || !n.within(s.scope) {
		return nil, e.notFound(id)
	}
	return n, nil
}

// sessionTarget resolves, for a call at now by session sid about node id,
// the node inside the session's scope: what a call that reads one node
// does first.
func (e *Engine) sessionTarget(sid SessionID, id NodeID, now int64) (*node, error) {
	s, err := e.session(sid, now)
	if err != nil {
		return nil, err
	}
	return e.target(s, id)
}

// sessionCharges resolves, for a call at now by session sid, the session
// and the request's charges normalized: what a call that decides a request
// does first.
func (e *Engine) sessionCharges(sid SessionID, charges map[string]int64, now int64) (*session, []Charge, error) {
	s, err := e.session(sid, now)
	if err != nil {
		return nil, nil, err
	}
	norm, err := normalizeCharges(charges)
	if err != nil {
		return nil, nil, err
	}
	return s, norm, nil
}

// editable resolves a node s may edit: inside its scope, and not the scope
// node itself, so a tenant can re-divide its budget but not raise its own.
func (e *Engine) editable(s *session, id NodeID) (*node, error) {
	n, err := e.target(s, id)
	if err != nil {
		return nil, err
	}
	if n == s.scope && s.id != System {
		return nil, fmt.Errorf("%w: a session cannot edit its own scope node %d", ErrPermission, id)
	}
	return n, nil
}

// requestResult is what a session remembers of a request it carried out.
type requestResult struct {
	fingerprint uint64
	node        NodeID
	lease       LeaseID
	amount      int64 // what a block or reservation request granted
	// chargedAt is when a request without a lease charged (its
	// EvCharged), so that GiveBackCharged refunds the window it spent in;
	// 0 when it took a lease, or was remembered before this was kept.
	chargedAt int64
}

// requestMemory holds a session's last RequestMemory request ids.
type requestMemory struct {
	byID  map[string]requestResult
	order []string // oldest first
}

func (m *requestMemory) add(id string, r requestResult) {
	if m.byID == nil {
		m.byID = make(map[string]requestResult)
	}
	if _, ok := m.byID[id]; ok {
		m.byID[id] = r
		return
	}
	m.order = append(m.order, id)
	if len(m.order) > RequestMemory {
		delete(m.byID, m.order[0])
		m.order = m.order[1:]
	}
	m.byID[id] = r
}

// forget drops one id, so a retry with it is decided afresh.
func (m *requestMemory) forget(id string) {
	if _, ok := m.byID[id]; !ok {
		return
	}
	delete(m.byID, id)
	if i := slices.Index(m.order, id); i >= 0 {
		m.order = slices.Delete(m.order, i, i+1)
	}
}

// lookup finds a remembered request. ok says it was found with the same
// arguments; an error says the id was used for something else.
func (m *requestMemory) lookup(id string, fp uint64) (requestResult, bool, error) {
	if id == "" {
		return requestResult{}, false, nil
	}
	r, ok := m.byID[id]
	if !ok {
		return requestResult{}, false, nil
	}
	if r.fingerprint != fp {
		return requestResult{}, false, fmt.Errorf("%w: %q", ErrRequestIDReused, id)
	}
	return r, true, nil
}

// ids returns the remembered ids, oldest first.
func (m *requestMemory) ids() []string { return slices.Clone(m.order) }

// Operations, as fingerprinted.
const (
	opConsume uint64 = iota + 1
	opAcquire
	opRelease
	opCreate
	opEnd
	opCaps
	opBlock
	opReserve
	opTenantState
	opShadow
)

// fingerprint hashes a request's arguments (FNV-1a) without allocating, so a
// reused request id can be told apart from a retry.
func fingerprint(op uint64, node NodeID, s string, amount int64) uint64 {
	h := fnvAdd(fnvOffset, op)
	h = fnvAdd(h, uint64(node))
	h = fnvString(h, s)
	return fnvAdd(h, uint64(amount))
}

func fingerprintCharges(op uint64, node NodeID, class string, charges []Charge) uint64 {
	h := fingerprint(op, node, class, int64(len(charges)))
	for _, c := range charges {
		h = fnvString(h, c.Resource)
		h = fnvAdd(h, uint64(c.Amount))
	}
	return h
}

func fingerprintMap(h uint64, m map[string]int64) uint64 {
	h = fnvAdd(h, uint64(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		h = fnvString(h, k)
		h = fnvAdd(h, uint64(m[k]))
	}
	return h
}

func fingerprintSpec(op uint64, parent NodeID, s *NodeSpec) uint64 {
	h := fingerprint(op, parent, s.Name, s.Deadline)
	for _, m := range []map[string]int64{s.Quotas, s.Limits, s.DefaultQuotas, s.DefaultLimits} {
		h = fingerprintMap(h, m)
	}
	h = fingerprintRates(fnvAdd(fnvAdd(h, uint64(s.Weight)), uint64(s.Priority)), s.Rates, s.DefaultRates)
	return fingerprintPeriods(h, s.QuotaPeriods, s.DefaultQuotaPeriods)
}

func fingerprintCaps(node NodeID, c *CapsEdit) uint64 {
	h := fingerprint(opCaps, node, "", 0)
	for _, m := range []map[string]int64{c.Quotas, c.Limits, c.DefaultQuotas, c.DefaultLimits} {
		h = fingerprintMap(h, m)
	}
	for _, p := range []*int64{c.Weight, c.Priority, c.Deadline} {
		if p == nil {
			h = fnvAdd(h, 1<<63)
		} else {
			h = fnvAdd(h, uint64(*p))
		}
	}
	// Modes came later: an edit without them keeps the fingerprint it
	// always had, so a remembered request id still matches after an upgrade.
	for i, m := range []map[string]CapMode{c.QuotaModes, c.LimitModes} {
		if m == nil {
			continue
		}
		h = fnvAdd(h, uint64(i+1))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			h = fnvAdd(fnvAdd(fnvString(h, k), uint64(m[k].Mode)), uint64(m[k].Burst))
		}
	}
	if c.Minimums != nil { // as modes: only when set
		h = fnvAdd(h, 3)
		for _, k := range slices.Sorted(maps.Keys(c.Minimums)) {
			m := c.Minimums[k]
			h = fnvAdd(fnvAdd(fnvAdd(fnvString(h, k), uint64(m.Min)), uint64(m.From)), uint64(m.Until))
		}
	}
	return fingerprintPeriods(fingerprintRates(h, c.Rates, c.DefaultRates), c.QuotaPeriods, c.DefaultQuotaPeriods)
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvAdd(h, v uint64) uint64 {
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= fnvPrime
		v >>= 8
	}
	return h
}

func fnvString(h uint64, s string) uint64 {
	h = fnvAdd(h, uint64(len(s)))
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}
