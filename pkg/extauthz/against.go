package extauthz

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Against checks the settings, and the keys file they loaded, against
// the rules they are served with: what each file accepts alone and is
// still wrong about the other. Each file loads; together they would
// serve something else than what they say:
//   - a domain the rules do not declare leaves every Check unlimited;
//   - a descriptor that no rule of the domain can match adds no limit;
//   - a keys file's tier that is not a plan of the domain's tiers gets
//     the default plan, and a limit name no rule gives overrides nothing.
//
// problems are errors: serve refuses them at start and on a reload of
// either file, as it refuses bad rules. warnings load (tollgate validate
// --strict refuses them). Every message names file:line: path.
func (s *Settings) Against(rs *limit.RuleSet) (problems config.Errors, warnings []string) {
	dom := rs.Domain(s.Domain)
	if dom == nil {
		var names []string
		for _, d := range rs.Domains() {
			names = append(names, d.Name)
		}
		msg := fmt.Sprintf("%q is not a domain of the rules (they declare %s): every Check would be admitted with no limit", s.Domain, listOr(names, "none"))
		if guess := config.Closest(s.Domain, names); guess != "" {
			msg += "; did you mean " + guess + "?"
		}
		problems = append(problems, config.Problem{File: s.Source, Line: s.domainLine, Path: "domain", Msg: msg})
		return problems, nil
	}
	for i, d := range s.Descriptors {
		if !mayMatch(dom, d) {
			keys := make([]string, len(d))
			for j, e := range d {
				keys[j] = e.Key
			}
			line := 0
			if i < len(s.descriptorLines) {
				line = s.descriptorLines[i]
			}
			problems = append(problems, config.Problem{File: s.Source, Line: line, Path: fmt.Sprintf("descriptors[%d]", i),
				Msg: fmt.Sprintf("(%s) matches no rule of domain %q (%s) with a limit: it would limit nothing", strings.Join(keys, ", "), dom.Name, dom.Source)})
		}
	}
	if s.Keys == nil {
		return problems, nil
	}
	names := limitNames(dom.Descriptors, nil)
	plans := dom.Tiers.PlanNames()
	for _, r := range s.Keys.Refs() {
		at := config.Problem{File: s.KeysFile, Line: r.Line, Path: r.Path}
		switch r.Kind {
		case authn.RefTier:
			if dom.Tiers == nil {
				at.Msg = fmt.Sprintf("warning: domain %q has no tiers, so tier %q changes nothing", dom.Name, r.Name)
				warnings = append(warnings, at.String())
				continue
			}
			if _, ok := dom.Tiers.Plans[r.Name]; ok {
				continue
			}
			at.Msg = fmt.Sprintf("tier %q is not a plan of domain %q (%s): its keys would get the default plan, %s", r.Name, dom.Name, strings.Join(plans, ", "), dom.Tiers.Default)
			if guess := config.Closest(r.Name, plans); guess != "" {
				at.Msg += "; did you mean " + guess + "?"
			}
		case authn.RefLimit:
			if slices.Contains(names, r.Name) {
				continue
			}
			at.Msg = fmt.Sprintf("%q names no rate_limit or token_limit of domain %q (named: %s): the override would change nothing", r.Name, dom.Name, listOr(names, "none"))
			if guess := config.Closest(r.Name, names); guess != "" {
				at.Msg += "; did you mean " + guess + "?"
			}
		}
		problems = append(problems, at)
	}
	return problems, warnings
}

// mayMatch says whether some request could give descriptor d a rule of
// dom with a limit: at each entry a rule with its key (and, for a literal
// value, one that matches it; any value otherwise), the last one with a
// limit. Entries of the tiers key are left out, as the Limiter leaves
// them out.
func mayMatch(dom *limit.Domain, d []Entry) bool {
	var keys []Entry
	for _, e := range d {
		if dom.Tiers == nil || e.Key != dom.Tiers.Key {
			keys = append(keys, e)
		}
	}
	if len(keys) == 0 {
		return false
	}
	var walk func(rules []*limit.Rule, i int) bool
	walk = func(rules []*limit.Rule, i int) bool {
		for _, r := range rules {
			if r.Key != keys[i].Key || !mayTake(r, keys[i].Source) {
				continue
			}
			if i == len(keys)-1 {
				if r.HasLimit() {
					return true
				}
				continue
			}
			if walk(r.Children, i+1) {
				return true
			}
		}
		return false
	}
	return walk(dom.Descriptors, 0)
}

// mayTake says whether rule r may match an entry whose value comes from
// src: any value may, but a literal one only where r's value takes it.
func mayTake(r *limit.Rule, src Source) bool {
	if src.Kind != FromLiteral || r.Value == "" {
		return true
	}
	return limit.ValueMatches(r, src.Arg)
}

// limitNames appends the names of the limits of rules, at any depth.
func limitNames(rules []*limit.Rule, out []string) []string {
	for _, r := range rules {
		for _, l := range []*limit.Limit{r.RateLimit, r.TokenLimit} {
			if l != nil && l.Name != "" && !slices.Contains(out, l.Name) {
				out = append(out, l.Name)
			}
		}
		out = limitNames(r.Children, out)
	}
	return out
}

// listOr joins names, or says none.
func listOr(names []string, none string) string {
	if len(names) == 0 {
		return none
	}
	return strings.Join(names, ", ")
}
