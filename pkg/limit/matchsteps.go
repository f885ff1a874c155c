package limit

// MatchKind is how a rule matched one entry.
type MatchKind uint8

const (
	// MatchNone: no rule under the previous one matches the entry.
	MatchNone MatchKind = iota
	// MatchExact: the rule's key and value.
	MatchExact
	// MatchWildcard: the rule's key and the most specific pattern ("gpt-*").
	MatchWildcard
	// MatchKey: the rule's key alone (no value: one counter per value).
	MatchKey
)

func (k MatchKind) String() string {
	switch k {
	case MatchExact:
		return "exact value"
	case MatchWildcard:
		return "wildcard"
	case MatchKey:
		return "key only"
	}
	return "no match"
}

// MatchStep is one entry of a descriptor and the rule it reached.
type MatchStep struct {
	Entry Entry
	Kind  MatchKind
	Rule  *Rule // nil for MatchNone
}

// MatchSteps is MatchShared's walk, reporting each step: the same child()
// lookups, in the same order.
func (d *Domain) MatchSteps(entries []Entry) []MatchStep {
	out := make([]MatchStep, 0, len(entries))
	node := &d.root
	for _, e := range entries {
		next := node.child(e)
		st := MatchStep{Entry: e, Rule: next}
		switch {
		case next == nil:
			return append(out, st)
		case next.Value == "":
			st.Kind = MatchKey
		case next.Wildcard():
			st.Kind = MatchWildcard
		default:
			st.Kind = MatchExact
		}
		out = append(out, st)
		node = next
	}
	return out
}

// ByValue reports whether the rule's metrics name entry values
// (value_to_metric on it or on a rule above it): see MetricEntries.
func (r *Rule) ByValue() bool { return r.byValue }

// MetricEntries is how the metrics of the rule entries reach (tier
// entries removed) name them, as envoyproxy/ratelimit names its stats,
// for a rule with DetailedMetric (detailed) or ByValue. An entry keeps its
// value when detailed, when the rule it reached has ValueToMetric, or
// when that rule names the value exactly; an entry a wildcard matched is
// otherwise named by the pattern, and one a key-only rule matched by its
// key alone (Value ""). An entry a ShareThreshold wildcard matched is
// named by the pattern in every case: its values share one counter.
// Entries past the walk's end are left as they are.
func (d *Domain) MetricEntries(entries []Entry, detailed bool) []Entry {
	return d.renamed(entries, func(_ int, r *Rule, v string) string {
		switch {
		case r.ShareThreshold && r.Wildcard():
			return r.Value
		case detailed || r.ValueToMetric || (r.Value != "" && !r.Wildcard()):
			return v
		case r.Wildcard():
			return r.Value
		}
		return ""
	})
}
