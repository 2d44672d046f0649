package server

import (
	"maps"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
)

// Every amount a call charges, reserves, settles or returns is checked here,
// at the API's edge, before the engine sees it: from 0 (or 1, where 0 asks
// for nothing) to governorpb.MaxAmount. The engine refuses what would
// overflow a counter too; this bound keeps any one call far from that, so
// that a hostile or broken client is told plainly what it sent.

// checkAmount refuses an amount outside [least, MaxAmount], naming the field.
func checkAmount(field string, v, least int64) error {
	if v < least || v > governorpb.MaxAmount {
		return status.Errorf(codes.InvalidArgument, "%s is %d; it must be from %d to %d", field, v, least, governorpb.MaxAmount)
	}
	return nil
}

// checkCharges refuses a charge outside [1, MaxAmount], naming its resource.
func checkCharges(field string, charges map[string]int64) error {
	for _, res := range slices.Sorted(maps.Keys(charges)) {
		if err := checkAmount(field+"["+res+"]", charges[res], 1); err != nil {
			return err
		}
	}
	return nil
}
