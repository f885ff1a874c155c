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
