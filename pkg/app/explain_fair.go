package app

import (
	"fmt"
	"io"

	"github.com/tollgate-dev/tollgate/pkg/admission"
)

// fairExplain is explain's view of a fair-shared charge (docs/fair-share.md).
type fairExplain struct {
	// Key is the rule's fair_share.key, Value the request's value of it
	// ("" for none: the overflow member) and Member what the store keeps.
	Key    string  `json:"key"`
	Value  string  `json:"value"`
	Member string  `json:"member"`
	Weight float64 `json:"weight"`
	// WeightFrom is plan, weights or default_weight.
	WeightFrom string  `json:"weight_from"`
	MinShare   float64 `json:"min_share"`
	Backlog    string  `json:"backlog"`
	Quantum    float64 `json:"quantum"`
	Credit     float64 `json:"credit"`
	MaxKeys    int     `json:"max_keys"`
}

// fairOf is c's fair share, nil when c is not fair-shared.
func fairOf(c admission.ChargeExplanation) *fairExplain {
	p := c.Charge.Fair.Policy
	if p == nil || c.Rule == nil || c.Rule.Fair == nil {
		return nil
	}
	fs := c.Rule.Fair
	f := &fairExplain{
		Key: fs.Key, Value: c.FairValue, Member: c.Charge.Fair.Member, Weight: c.Charge.Fair.Weight,
		MinShare: p.MinShare, Backlog: p.Backlog.String(), Quantum: p.Quantum, Credit: p.Credit, MaxKeys: p.MaxKeys,
	}
	switch _, listed := fs.Weights[c.FairValue]; {
	case fs.Plan:
		f.WeightFrom = "plan"
	case listed:
		f.WeightFrom = "weights"
	default:
		f.WeightFrom = "default_weight"
	}
	return f
}

// writeText prints f under its limit; nothing when f is nil.
func (f *fairExplain) writeText(w io.Writer) {
	if f == nil {
		return
	}
	who := fmt.Sprintf("%s=%s (member %s)", f.Key, f.Value, f.Member)
	if f.Value == "" {
		who = fmt.Sprintf("no %s entry: the overflow member every such request shares", f.Key)
	}
	fmt.Fprintf(w, "    fair_share: one budget shared by %s values, not multiplied by the plan; %s, weight %v (%s)\n",
		f.Key, who, f.Weight, f.WeightFrom)
	fmt.Fprintf(w, "      min_share %v, backlog %v, quantum %v, credit %v, max_keys %d\n",
		f.MinShare, f.Backlog, f.Quantum, f.Credit, f.MaxKeys)
}
