package hacheck

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// The model. Two kinds of object are independent of each other, so the
// history is partitioned by object and each part checked alone:
//
//   - the task's "calls" counter: consume adds 1, read returns it;
//   - each lease, by its id (a fencing token, never reissued): acquire
//     creates it held, validate reports whether it is held, release ends
//     it. That two leases of the limit-1 class are never held at once is
//     not a property of one lease: the downstream judges it.
//
// A call whose outcome is unknown (no definite answer before its client
// gave up) may have taken effect at any time after it was sent: its
// return is the end of the history and the model allows both outcomes.

type opKind int

const (
	opConsume opKind = iota
	opRead
	opAcquire
	opValidate
	opRelease
)

type input struct {
	kind  opKind
	lease int64 // validate, release; acquire's is in the output
}

type output struct {
	unknown bool  // no definite answer
	value   int64 // read: the count; acquire: the lease id
	ok      bool  // validate: held; release: released
}

// counterModel is the "calls" counter.
var counterModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{int64(0)} },
	Step: func(state, in, out interface{}) []interface{} {
		n := state.(int64)
		i, o := in.(input), out.(output)
		switch i.kind {
		case opConsume:
			if o.unknown {
				return []interface{}{n, n + 1}
			}
			return []interface{}{n + 1}
		case opRead:
			if o.value == n {
				return []interface{}{n}
			}
		}
		return nil
	},
}

// leaseModel is one lease: false before its acquire and after its end.
var leaseModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{false} },
	Step: func(state, in, out interface{}) []interface{} {
		held := state.(bool)
		i, o := in.(input), out.(output)
		switch i.kind {
		case opAcquire:
			if !held {
				return []interface{}{true}
			}
		case opValidate:
			if o.ok == held {
				return []interface{}{held}
			}
		case opRelease:
			switch {
			case o.unknown:
				return []interface{}{held, false}
			case o.ok && held:
				return []interface{}{false}
			case !o.ok && !held:
				return []interface{}{false}
			}
		}
		return nil
	},
}

// check checks history (with unknown outcomes' returns already at the end)
// part by part, and returns the first part that is not linearizable.
func check(history []porcupine.Operation) error {
	var counter []porcupine.Operation
	leases := map[int64][]porcupine.Operation{}
	for _, op := range history {
		i, o := op.Input.(input), op.Output.(output)
		switch i.kind {
		case opConsume, opRead:
			counter = append(counter, op)
		case opAcquire:
			if !o.unknown {
				leases[o.value] = append(leases[o.value], op)
			}
		default:
			if i.kind == opValidate && o.unknown {
				continue // a read without an answer says nothing
			}
			leases[i.lease] = append(leases[i.lease], op)
		}
	}
	if res := porcupine.CheckOperationsTimeout(counterModel.ToModel(), counter, 0); res != porcupine.Ok {
		return fmt.Errorf("the counter's history of %d calls is not linearizable (%v)", len(counter), res)
	}
	for id, ops := range leases {
		if res := porcupine.CheckOperationsTimeout(leaseModel.ToModel(), ops, 0); res != porcupine.Ok {
			return fmt.Errorf("the history of lease %d (%d calls) is not linearizable (%v)", id, len(ops), res)
		}
	}
	return nil
}
