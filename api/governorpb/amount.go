package governorpb

// MaxAmount is the largest amount one call may charge, reserve, settle or
// return of one resource (ConsumeRequest.amount, the charges of
// ChargeAndAcquire and DryRun, ReserveRequest's spent, return and want,
// ResizeBlockRequest's want and return): 2^53. governord refuses a larger
// one, or a negative one, with INVALID_ARGUMENT.
//
// It is the largest integer a JSON number, and so a JavaScript number,
// carries exactly, so every client reads an amount as it was sent; and it
// is 1,024 times short of int64's end, so that no sum of a few amounts can
// wrap around and pass a cap. A tenant's own counters refuse, with
// INVALID_ARGUMENT, the amount that would take them past int64's end; the
// root's, which every tenant shares, saturate there instead, so that one
// tenant's amounts never refuse another's.
const MaxAmount int64 = 1 << 53
