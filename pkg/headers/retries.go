package headers

import "strconv"

// MaxRetries is the request header Envoy's router reads as the number of
// retries it may make for the request (docs/retry-budget.md): the
// adapters set it on an admitted request of a domain with a retry budget,
// Check among the headers to set upstream and ShouldRateLimit in
// request_headers_to_add.
const MaxRetries = "x-envoy-max-retries"

// Retries formats a retry budget as MaxRetries carries it. A negative
// budget is 0: Envoy reads the value as unsigned and ignores one it
// cannot parse, which would leave the route's own count in force.
func Retries(n int) string { return strconv.Itoa(max(n, 0)) }
