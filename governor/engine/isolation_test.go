package engine

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// A denial on the root as a tenant's session sees it: the root's used and
// limit, and its largest consumer only if that lies in the tenant, by every
// path that can refuse a charge.
func TestDenialOnASharedNodeHidesOtherTenants(t *testing.T) {
	hidden := Consumer{Name: OtherTenant}
	tests := []struct {
		name string
		// refuse spends the root's 10 tokens, 8 of them by other, and
		// returns acme's refused call.
		refuse func(f *fixture) error
		// what acme, other and the system session are told.
		acme, other, system Consumer
	}{
		{name: "consume", refuse: func(f *fixture) error {
			f.consume(f.sB, f.otherJob, "tokens", 8)
			f.consume(f.sA, f.job, "tokens", 2)
			return f.e.Consume(f.sA, f.job, "tokens", 1, "")
		}},
		{name: "a charge with a lease", refuse: func(f *fixture) error {
			f.consume(f.sB, f.otherJob, "tokens", 8)
			f.consume(f.sA, f.job, "tokens", 2)
			_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": 1}})
			return err
		}},
		{name: "a reservation", refuse: func(f *fixture) error {
			f.consume(f.sB, f.otherJob, "tokens", 8)
			f.consume(f.sA, f.job, "tokens", 2)
			_, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 1})
			return err
		}},
		{name: "a charge that waited in the queue", refuse: func(f *fixture) error {
			f.setCaps(RootID, CapsEdit{Quotas: map[string]int64{"tokens": 10}, Limits: map[string]int64{"db": 1}})
			theirs := f.acquire(f.sB, f.otherJob, "db")
			_, wait, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": 1}})
			if err != nil || wait == nil {
				f.t.Fatalf("acme's acquire: %v, %v; want it queued", wait, err)
			}
			f.consume(f.sB, f.otherJob, "tokens", 8) // while acme waits
			f.consume(f.sA, f.job, "tokens", 2)
			f.release(f.sB, theirs)
			o := <-wait.C
			return o.Err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.setCaps(RootID, CapsEdit{Quotas: map[string]int64{"tokens": 10}})
			err := tt.refuse(f)
			var d *Denial
			if !errors.As(err, &d) {
				t.Fatalf("acme's refusal %v is not a *Denial", err)
			}
			want := Denial{Resource: "tokens", Node: RootID, NodeName: "root", Used: 10, Limit: 10, Amount: 1, Largest: hidden}
			if *d != want {
				t.Errorf("acme is told\n %+v\nwant %+v", *d, want)
			}
			if msg := d.Error(); strings.Contains(msg, "other") && !strings.Contains(msg, OtherTenant) || strings.Contains(msg, "8") {
				t.Errorf("acme's message %q names other or its usage", msg)
			}
			if !strings.HasSuffix(d.Error(), "largest consumer: "+OtherTenant) {
				t.Errorf("acme's message %q does not say another tenant spent it", d.Error())
			}
			// other, and the operator, are told who.
			for who, sid := range map[string]SessionID{"other": f.sB, "the system session": System} {
				err := f.e.Consume(sid, f.otherJob, "tokens", 1, "")
				if !errors.As(err, &d) || d.Largest != (Consumer{Node: f.other, Name: "other", Used: 8}) {
					t.Errorf("%s is told %v; want other with 8", who, err)
				}
			}
		})
	}
}

// A tenant is told of its own spending on a shared node, and nobody's when
// the shared node's own direct charges are the largest.
func TestDenialOnASharedNodeNamesTheOwnTenant(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Quotas: map[string]int64{"tokens": 10}})
	f.consume(f.sB, f.otherJob, "tokens", 3)
	f.consume(f.sA, f.job, "tokens", 6)
	var d *Denial
	if err := f.e.Consume(f.sA, f.job2, "tokens", 2, ""); !errors.As(err, &d) || d.Largest != (Consumer{Node: f.acme, Name: "acme", Used: 6}) {
		t.Errorf("acme, the largest consumer, is told %v; want acme with 6", err)
	}
	if err := f.e.Consume(f.sB, f.otherJob, "tokens", 2, ""); !errors.As(err, &d) || d.Largest != (Consumer{Name: OtherTenant}) {
		t.Errorf("other is told %v; want %q", err, OtherTenant)
	}
	// A denial inside the tenant is unchanged: job's cap, step the largest.
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 6}})
	if err := f.e.Consume(f.sA, f.job, "tokens", 1, ""); !errors.As(err, &d) || d.Node != f.job || d.Largest != (Consumer{Node: f.job, Name: "job", Used: 6}) {
		t.Errorf("acme on its own job's cap is told %v", err)
	}
	// What the operator charged to the root itself is not acme's either.
	f2 := newFixture(t)
	f2.setCaps(RootID, CapsEdit{Quotas: map[string]int64{"tokens": 10}})
	f2.consume(System, RootID, "tokens", 9)
	if err := f2.e.Consume(f2.sA, f2.job, "tokens", 2, ""); !errors.As(err, &d) || d.Largest != (Consumer{Name: OtherTenant}) {
		t.Errorf("acme, after the root's own charges, is told %v; want %q", err, OtherTenant)
	}
}

// A node or lease outside the scope is not found, in the words of one that
// never existed, whatever state it is in.
func TestOutsideTheScopeReadsAsNoSuchThing(t *testing.T) {
	f := newFixture(t)
	live := f.acquire(f.sB, f.otherJob, "db")
	released := f.acquire(f.sB, f.otherJob, "db")
	f.release(f.sB, released)
	strip := func(err error, id int64) string {
		return strings.ReplaceAll(err.Error(), " "+strconv.FormatInt(id, 10), " <id>")
	}
	for _, id := range []NodeID{RootID, f.other, f.otherJob} {
		_, err := f.e.Get(f.sA, id)
		_, errNone := f.e.Get(f.sA, noSuch)
		if !errors.Is(err, ErrNotFound) || strip(err, int64(id)) != strip(errNone, noSuch) {
			t.Errorf("Get of node %d: %v; of node %d, which never existed: %v", id, err, noSuch, errNone)
		}
	}
	for _, id := range []LeaseID{live, released} {
		_, err := f.e.Validate(f.sA, id)
		_, errNone := f.e.Validate(f.sA, noSuch)
		if !errors.Is(err, ErrNotFound) || strip(err, int64(id)) != strip(errNone, noSuch) {
			t.Errorf("Validate of lease %d: %v; of lease %d: %v", id, err, noSuch, errNone)
		}
		err = f.e.Release(f.sA, id, 0, false, "")
		errNone = f.e.Release(f.sA, noSuch, 0, false, "")
		if !errors.Is(err, ErrNotFound) || strip(err, int64(id)) != strip(errNone, noSuch) {
			t.Errorf("Release of lease %d: %v; of lease %d: %v", id, err, noSuch, errNone)
		}
	}
}
