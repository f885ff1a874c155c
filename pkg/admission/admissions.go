package admission

// Admissions is told of every decision of a domain with a Control (not
// of a request that only settles an earlier one): the controller's
// offered and admitted counts and its flights come from it. pkg/pressure's
// Controller is one. It runs on the decision path, so it must not block:
// it counts and queues.
type Admissions interface {
	// Decided reports a decision of domain for a request naming upstream
	// (the value of the Control's Key, "" when it has none) of tier. For
	// an admitted request of a controlled upstream it begins a flight
	// under id (a fresh ID when id is empty) and returns that ID, which
	// the request's ticket must carry so its completion ends the flight;
	// it returns "" otherwise.
	Decided(domain, upstream, tier string, admitted bool, id string) string
}

// WithAdmissions makes the Limiter report the decisions of domains with
// a Control to a.
func WithAdmissions(a Admissions) Option { return func(l *Limiter) { l.admissions = a } }
