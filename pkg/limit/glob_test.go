package limit

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestGlobMatchAgreesWithRegexp checks globMatch against a regular
// expression of the same pattern, each * a (?s).*, on every short
// pattern and value over a small alphabet, where overlaps are likely.
func TestGlobMatchAgreesWithRegexp(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ab*"
	word := func(n int, abc string) string {
		var b strings.Builder
		for range n {
			b.WriteByte(abc[rng.IntN(len(abc))])
		}
		return b.String()
	}
	checked := 0
	for range 20000 {
		pat := word(1+rng.IntN(6), alphabet)
		if !strings.Contains(pat, "*") {
			continue
		}
		parts := strings.Split(pat, "*")
		quoted := make([]string, len(parts))
		for i, p := range parts {
			quoted[i] = regexp.QuoteMeta(p)
		}
		re := regexp.MustCompile(`(?s)\A` + strings.Join(quoted, ".*") + `\z`)
		v := word(rng.IntN(7), "ab")
		if got, want := globMatch(parts, v), re.MatchString(v); got != want {
			t.Fatalf("globMatch(%q, %q) = %v, want %v", pat, v, got, want)
		}
		checked++
	}
	if checked < 10000 {
		t.Fatalf("only %d cases checked", checked)
	}
}
