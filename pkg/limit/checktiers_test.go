package limit

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSheddingCheckTiers covers the one check of the controller against
// the tiers, which the rule parser reports at its lines and NewRuleSet
// returns.
func TestSheddingCheckTiers(t *testing.T) {
	t.Parallel()
	tiers := &Tiers{Key: "tier", Default: "free", Plans: map[string]float64{"free": 1, "premium": 3}}
	control := func(sheddable ...string) *Shedding {
		return &Shedding{Control: &Control{DefaultCapacity: 1, Sheddable: sheddable}}
	}
	tests := []struct {
		name      string
		give      *Shedding
		giveTiers *Tiers
		want      []FieldError
		wantRules string // NewRuleSet's error; "" for none
	}{
		{name: "no controller", give: &Shedding{}, giveTiers: nil},
		{name: "sheds plans", give: control("free", "premium"), giveTiers: tiers},
		{
			name: "no tiers", give: control("free"),
			want:      []FieldError{{"control", "the controller sheds tiers: the file needs tiers"}},
			wantRules: `domain "d": shedding: control: the controller sheds tiers: the file needs tiers`,
		},
		{
			name: "tiers not plans", give: control("free", "bronze", "gold"), giveTiers: tiers,
			want: []FieldError{
				{"control.sheddable[1]", `"bronze" is not a plan of tiers`},
				{"control.sheddable[2]", `"gold" is not a plan of tiers`},
			},
			wantRules: `domain "d": shedding: control.sheddable[1]: "bronze" is not a plan of tiers`,
		},
		{
			// Check reports the empty tier; CheckTiers does not repeat it.
			name: "empty tier", give: control("free", ""), giveTiers: tiers,
			wantRules: `domain "d": shedding: control.sheddable[1]: empty tier`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, tt.give.CheckTiers(tt.giveTiers)); diff != "" {
				t.Errorf("CheckTiers (-want +got):\n%s", diff)
			}
			_, err := NewRuleSet(&Domain{Name: "d", Tiers: tt.giveTiers, Shedding: tt.give})
			switch {
			case tt.wantRules == "" && err != nil:
				t.Errorf("NewRuleSet = %v, want no error", err)
			case tt.wantRules != "" && (err == nil || err.Error() != tt.wantRules):
				t.Errorf("NewRuleSet = %v, want %q", err, tt.wantRules)
			}
		})
	}
}
