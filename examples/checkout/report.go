package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// report is a whole run: its settings and its four phases.
type report struct {
	Options     options `json:"options"`
	PSPCapacity int     `json:"psp_capacity"`
	Phases      []phase `json:"phases"`
}

// find returns the phase of a mode, with or without the batch.
func (r *report) find(governed, batch bool) *phase {
	for i := range r.Phases {
		if r.Phases[i].Governor == governed && r.Phases[i].Batch == batch {
			return &r.Phases[i]
		}
	}
	return nil
}

func (r *report) print(out io.Writer) {
	o := r.Options
	fmt.Fprintf(out, "\nThe checkout took %d orders a second for %v per phase; the batch ran %d workers; the gateway serves %d at once.\n\n",
		o.Rate, o.Phase, o.Workers, r.PSPCapacity)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\t\tcheckout\t\t\t\tbatch\t\tgateway\t")
	fmt.Fprintln(w, "\tphase\torders\tfailed\tp50\tp99\tpaid\t429s\tpeak\t429s")
	for _, p := range r.Phases {
		mode := map[bool]string{false: "without Governor", true: "with Governor"}[p.Governor]
		paid, got := "-", "-"
		if p.Nightly != nil {
			paid, got = fmt.Sprint(p.Nightly.Paid), fmt.Sprint(p.Nightly.Got429)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%.0f ms\t%.0f ms\t%s\t%s\t%d\t%d\n", mode, p.Name, p.Checkout.Requests,
			p.Checkout.failures(), p.Checkout.P50ms, p.Checkout.P99ms, paid, got, p.Gateway.Peak, p.Gateway.Rejected)
	}
	w.Flush()
	without, with, alone := r.find(false, true), r.find(true, true), r.find(true, false)
	if without == nil || with == nil || alone == nil {
		return
	}
	fmt.Fprintf(out, "\nWhile the batch ran, %d of %d checkouts failed without Governor and %d of %d with it;\n"+
		"the checkout's p99 was %.0f ms without and %.0f ms with (%.0f ms alone); the gateway saw up to %d requests at once\n"+
		"without Governor and %d with it, and the batch paid %d payouts without and %d with.\n",
		without.Checkout.failures(), without.Checkout.Requests, with.Checkout.failures(), with.Checkout.Requests,
		without.Checkout.P99ms, with.Checkout.P99ms, alone.Checkout.P99ms,
		without.Gateway.Peak, with.Gateway.Peak, without.Nightly.Paid, with.Nightly.Paid)
}
