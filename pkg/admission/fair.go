package admission

import "github.com/tollgate-dev/tollgate/pkg/limit"

// fairCharge is the fair share of rule r's charges in req (zero when r
// shares nothing): the member is the first value of r.Fair.Key in any of
// the request's descriptors, tier entries included, or the overflow
// member when none carries it; the weight is the plan multiplier micro
// (weights: plan) or the value's weight. policy is set by the caller: the
// rate and token limits have a policy each.
func fairCharge(req *limit.Request, r *limit.Rule, micro uint64) limit.FairCharge {
	if r == nil || r.Fair == nil {
		return limit.FairCharge{}
	}
	fs := r.Fair
	value := firstValue(req, fs.Key)
	w := fs.DefaultWeight
	switch {
	case fs.Plan:
		w = float64(micro) / limit.MicroOne
	default:
		if x, ok := fs.Weights[value]; ok {
			w = x
		}
	}
	return limit.FairCharge{Member: limit.FairMember(value), Weight: w}
}
