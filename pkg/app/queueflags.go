package app

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// queueAdapters are the adapters --queue-adapters may name.
var queueAdapters = []string{retryAdapterExtAuthz, retryAdapterRLS}

// queueFlags say which adapters' requests may wait in a domain's queue
// (docs/admission-queue.md). A domain's rules serve every adapter, and
// the adapters' callers give different timeouts (the shipped ratelimit
// filter 100ms, ext_authz 250ms), so an operator who raises one may want
// only that adapter to wait.
type queueFlags struct {
	adapters adapterSet
}

// adapterSet is --queue-adapters' value; its zero value, the flag
// unset, is every adapter.
type adapterSet struct {
	set           bool
	extAuthz, rls bool
}

// String is the set as the flag takes it.
func (a *adapterSet) String() string {
	if a == nil || !a.set {
		return strings.Join(queueAdapters, ",")
	}
	var on []string
	if a.extAuthz {
		on = append(on, retryAdapterExtAuthz)
	}
	if a.rls {
		on = append(on, retryAdapterRLS)
	}
	return strings.Join(on, ",")
}

// Set reads a comma-separated list of adapters; empty is none.
func (a *adapterSet) Set(v string) error {
	*a = adapterSet{set: true}
	for name := range strings.SplitSeq(v, ",") {
		switch strings.TrimSpace(name) {
		case "":
		case retryAdapterExtAuthz:
			a.extAuthz = true
		case retryAdapterRLS:
			a.rls = true
		default:
			return fmt.Errorf("%q is not one of %s", name, strings.Join(queueAdapters, ", "))
		}
	}
	return nil
}

// waits says whether adapter's requests may wait.
func (a adapterSet) waits(adapter string) bool {
	switch {
	case !a.set:
		return true
	case adapter == retryAdapterExtAuthz:
		return a.extAuthz
	default:
		return a.rls
	}
}

func (q *queueFlags) register(fs *flag.FlagSet) {
	fs.Var(&q.adapters, "queue-adapters",
		"adapters whose refused requests may wait in their domain's queue, comma-separated (ext_authz, rls); empty: none waits (default ext_authz,rls)")
}

// apply returns d for adapter, or, when adapter may not wait, d asking
// every decision under admission.WithoutQueue.
func (q *queueFlags) apply(d decider, adapter string) decider {
	if q.adapters.waits(adapter) {
		return d
	}
	return noWait{d}
}

// noWait is a decider whose requests never wait in a queue.
type noWait struct{ decider }

// Decide asks the wrapped decider under admission.WithoutQueue.
func (n noWait) Decide(ctx context.Context, req *limit.Request) (*admission.Decision, error) {
	return n.decider.Decide(admission.WithoutQueue(ctx), req)
}
