package pressure

import (
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func TestGate(t *testing.T) {
	t.Parallel()
	global, _ := newEval(t, designPolicy())
	model, _ := newEval(t, designPolicy())
	shadowPolicy := designPolicy()
	shadowPolicy.Shadow = true
	shadow, err := NewEvaluator(shadowPolicy, storetest.NewFakeClock(t0))
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate()
	if got := g.Shed("d", limit.ScopeGlobal, "free"); got != (limit.ShedState{}) {
		t.Fatalf("empty gate: %+v", got)
	}
	g.Set(GateEntry{"d", limit.ScopeGlobal, global}, GateEntry{"d", "gpt-4o", model}, GateEntry{"s", limit.ScopeGlobal, shadow})
	global.Update(0.85)
	model.Update(0.95)
	shadow.Update(0.95)
	tests := []struct {
		name                string
		domain, scope, tier string
		want                limit.ShedState
	}{
		{name: "global sheds free", domain: "d", scope: limit.ScopeGlobal, tier: "free", want: limit.ShedState{Shed: true, Factor: 0.7, NoBurst: true}},
		{name: "global shrinks premium", domain: "d", scope: limit.ScopeGlobal, tier: "premium", want: limit.ShedState{Factor: 0.7, NoBurst: true}},
		{name: "a model's own scope", domain: "d", scope: "gpt-4o", tier: "standard", want: limit.ShedState{Shed: true, Factor: 0.7, NoBurst: true}},
		{name: "a model without a scope reads global", domain: "d", scope: "llama", tier: "standard", want: limit.ShedState{Factor: 0.7, NoBurst: true}},
		{name: "shadow", domain: "s", scope: limit.ScopeGlobal, tier: "free", want: limit.ShedState{Shed: true, Shadow: true, Factor: 0.7, NoBurst: true}},
		{name: "unknown domain", domain: "x", scope: limit.ScopeGlobal, tier: "free"},
	}
	for _, tt := range tests {
		if got := g.Shed(tt.domain, tt.scope, tt.tier); got != tt.want {
			t.Errorf("%s: Shed = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
