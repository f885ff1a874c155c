package app

import (
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The filter timeouts the shipped manifests give Envoy's calls to
// Tollgate (TestShippedTimeouts reads them from the files): a held
// request is answered before the caller's deadline less
// admission.QueueMargin, so a queue's max_wait above them is cut short.
const (
	// shippedAuthzTimeout is ext_authz's grpc_service timeout in
	// envoy/envoy-ext-authz.yaml and istio/mesh-config.yaml.
	shippedAuthzTimeout = 250 * time.Millisecond
	// shippedRLSTimeout is the ratelimit filter's timeout in envoy/envoy.yaml.
	shippedRLSTimeout = 100 * time.Millisecond
)

// queueWarnings are validate's warnings about the domains' queues: each
// whose longest wait the shipped manifests' filter timeouts cut short.
func queueWarnings(rs *limit.RuleSet) []string {
	var out []string
	for _, d := range rs.Domains() {
		if d.Queue == nil {
			continue
		}
		w := d.Queue.MaxWait()
		if w+admission.QueueMargin <= shippedRLSTimeout {
			continue
		}
		out = append(out, fmt.Sprintf("%s: warning: domain %q: queue max_wait %v is longer than the shipped manifests' filter timeouts "+
			"(ext_authz %v in envoy/envoy-ext-authz.yaml and istio/mesh-config.yaml, ratelimit %v in envoy/envoy.yaml) less %v: "+
			"a wait ends at the deadline; raise the timeout to at least %v (docs/admission-queue.md)",
			d.Source, d.Name, w, shippedAuthzTimeout, shippedRLSTimeout, admission.QueueMargin, w+admission.QueueMargin))
	}
	return out
}

// queueNote is explain's line about how a refusal of a request of tier
// waits in dom's queue; "" when dom has none.
func queueNote(dom *limit.Domain, tier string) string {
	q := dom.Queue
	if q == nil {
		return ""
	}
	qt, rank, ok := q.For(tier)
	switch {
	case qt.Skip:
		return fmt.Sprintf("queue: tier %q skips it: a refusal by a limit is answered at once", tier)
	case !ok:
		return fmt.Sprintf("queue: tier %q does not wait: a refusal by a limit is answered at once", tier)
	}
	return fmt.Sprintf("queue: a refusal by a limit or cap waits up to %v or the caller's deadline less %v (priority %d of %d, then FIFO; at most %d waiting per replica), retrying at least every %v",
		qt.MaxWait, admission.QueueMargin, rank+1, len(q.Tiers)+1, qt.MaxLength, q.PollEvery())
}
