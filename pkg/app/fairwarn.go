package app

import (
	"fmt"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// fairWarnings are validate's warnings about limits that the plan
// multiplier scales although every requester shares them
// (docs/fair-share.md, "Config").
//
// A rule's counter is keyed by the entries of its path, so config knows
// which counters are one for every request: those whose path, from the
// top rule down to the rule, has only exact values and share_threshold
// wildcards. Such a counter is shared by every tenant that sends the
// descriptor. With tiers, each request checks it against the amount times
// its own plan, so a premium request is admitted into a counter that free
// requests have already filled, up to the largest multiplier times the
// amount in all. The warning names each such rate_limit and token_limit
// that is not fair-shared.
//
// A path with a per-value entry (a key alone, or a wildcard without
// share_threshold) is not warned of, although a counter per model is
// shared by the tenants too: config cannot tell which descriptor keys
// name tenants, and a false warning on every per-tenant limit would teach
// people to ignore the real one.
func fairWarnings(rs *limit.RuleSet) []string {
	var out []string
	for _, d := range rs.Domains() {
		if d.Tiers == nil {
			continue
		}
		top := maxPlan(d.Tiers)
		if top <= 1 {
			continue // no plan admits more than the amount
		}
		var walk func(rules []*limit.Rule)
		walk = func(rules []*limit.Rule) {
			for _, r := range rules {
				if !sharedByAll(r) {
					continue // and so is every counter below it
				}
				if r.Fair == nil && !r.Unlimited {
					var kinds []string
					if r.RateLimit != nil {
						kinds = append(kinds, "rate_limit")
					}
					if r.TokenLimit != nil {
						kinds = append(kinds, "token_limit")
					}
					if len(kinds) > 0 {
						out = append(out, fmt.Sprintf("%s: warning: domain %q: rule %s: its %s is one counter every request of the descriptor shares (no entry on its path has a value of its own), "+
							"and the plan multiplier scales it per request, so up to x%v of it can be admitted in all; "+
							"add fair_share to share it by plan instead (docs/fair-share.md)",
							d.Source, d.Name, r.ID, strings.Join(kinds, " and "), top))
					}
				}
				walk(r.Children)
			}
		}
		walk(d.Descriptors)
	}
	return append(out, backlogWarnings(rs)...)
}

// fairBacklogWarn is the longest fair_share backlog validate takes
// quietly: the longest with which the simulated spike of
// TestFairDefaultsManyTenants (pkg/config) still used the whole limit after
// the spike. With 1 min it used 12-20% (docs/fair-share.md, "Defaults").
const fairBacklogWarn = 5 * time.Second

// backlogWarnings are validate's warnings about fair-shared limits whose
// backlog is long: a member stays waiting that long after a denial and
// the gate holds room for it, so with many members that ask less often
// than that, the room held for them goes unused.
func backlogWarnings(rs *limit.RuleSet) []string {
	var out []string
	for _, d := range rs.Domains() {
		var walk func(rules []*limit.Rule)
		walk = func(rules []*limit.Rule) {
			for _, r := range rules {
				if f := r.Fair; f != nil {
					for _, pl := range []struct {
						kind string
						p    *limit.FairPolicy
					}{{"rate_limit", f.Rate}, {"token_limit", f.Token}} {
						if pl.p != nil && pl.p.Backlog > fairBacklogWarn {
							out = append(out, fmt.Sprintf("%s: warning: domain %q: rule %s: its %s's fair_share backlog is %v: a member denied stays owed room that long, "+
								"and with many members that ask less often, the room held for them goes unused (in docs/fair-share.md, \"Defaults\", %v did not, and 1m wasted most of the limit after a spike)",
								d.Source, d.Name, r.ID, pl.kind, pl.p.Backlog, fairBacklogWarn))
						}
					}
				}
				walk(r.Children)
			}
		}
		walk(d.Descriptors)
	}
	return out
}

// sharedByAll says whether r's entry is the same for every request it
// matches: an exact value, or a wildcard whose values share a counter.
func sharedByAll(r *limit.Rule) bool {
	switch {
	case r.Value == "":
		return false
	case r.Wildcard():
		return r.ShareThreshold
	default:
		return true
	}
}

// maxPlan is the largest plan multiplier of t.
func maxPlan(t *limit.Tiers) float64 {
	m := 0.0
	for _, v := range t.Plans {
		m = max(m, v)
	}
	return m
}
