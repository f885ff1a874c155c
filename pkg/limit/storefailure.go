package limit

// StoreFailure is what a rule's charges do when the store cannot answer
// (an error, a timeout, or a circuit open in front of it): the rules
// file's store_failure. The policies:
//
//   - allow: the charges are treated as admitted; nothing is recorded.
//   - deny: the charges are over limit, with a RetryAfter of
//     DegradedRetryAfter.
//   - local (the default): the charges run on an in-process store, each
//     limit scaled down to this replica's share of it (see
//     FailurePolicy.LocalFraction and localShare).
//
// In a degraded decision, refunds (negative hits) are dropped, and so are
// cost reports (Force charges) of allow and deny rules: the store would
// have recorded them, and an in-process store whose state is gone with
// the next restart is no place for them; a local rule's cost report is
// charged locally. What a local rule kept is written back to the store
// with the next decision on its key that reaches it (see owed). Concurrency caps follow their rule's policy (local:
// a lease on the in-process store, released by the access log as
// usual). What is dropped is counted (FailureObserver.Dropped).
type StoreFailure uint8

const (
	// FailureUnset inherits: from the parent rule, then the domain, then
	// the Limiter's default.
	FailureUnset StoreFailure = iota
	FailureAllow
	FailureDeny
	FailureLocal
)

var failureNames = [...]string{FailureUnset: "", FailureAllow: "allow", FailureDeny: "deny", FailureLocal: "local"}

func (f StoreFailure) String() string {
	if int(f) < len(failureNames) && f != FailureUnset {
		return failureNames[f]
	}
	return "unset"
}

// StoreFailureNames lists the accepted names, for error messages.
func StoreFailureNames() string { return "allow|deny|local" }

// ParseStoreFailure maps a name (allow, deny, local) to its policy.
func ParseStoreFailure(s string) (StoreFailure, bool) {
	for i, n := range failureNames {
		if n != "" && n == s {
			return StoreFailure(i), true
		}
	}
	return FailureUnset, false
}
