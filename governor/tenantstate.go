package governor

import (
	"errors"
	"fmt"

	"github.com/governor-project/governor/api/governorpb"
)

// ErrTenantState matches a *TenantStateError: work the tenant's state
// refuses (SetTenantState in the API).
var ErrTenantState = errors.New("refused by the tenant's state")

// TenantStateError is work refused because its tenant is suspended
// (nothing new), read_only (no new writes) or closing (no new tasks).
type TenantStateError struct {
	Tenant  string
	State   string // "suspended", "read_only" or "closing"
	Reason  string // the operator's reason for the state
	Refused string // what was refused: "new work", "a write", "a new task"
}

func (e *TenantStateError) Error() string {
	s := fmt.Sprintf("tenant %q is %s; %s is refused", e.Tenant, e.State, e.Refused)
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	return s
}

// Is makes errors.Is(e, ErrTenantState) true.
func (e *TenantStateError) Is(target error) bool { return target == ErrTenantState }

// TenantRefusalError is the error of a refusal's detail (as a DryRun's
// answer carries it, through Raw); nil for none.
func TenantRefusalError(d *governorpb.TenantRefusal) *TenantStateError { return tenantRefusal(d) }

// tenantRefusal is the error of a refusal's detail; nil for none.
func tenantRefusal(d *governorpb.TenantRefusal) *TenantStateError {
	if d == nil {
		return nil
	}
	return &TenantStateError{Tenant: d.GetTenant(), State: d.GetState(), Reason: d.GetReason(), Refused: d.GetRefused()}
}
