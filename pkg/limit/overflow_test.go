package limit

import (
	"math"
	"testing"
	"time"
)

// longest is MaxWindow, spelled out so that the tests build on code
// without it.
const longest = time.Duration(math.MaxInt64)

func TestLimitWindowSaturates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give Limit
		want time.Duration
	}{
		{name: "unset multiplier", give: Limit{Unit: Day}, want: 24 * time.Hour},
		{name: "30 seconds", give: Limit{Unit: Second, Multiplier: 30}, want: 30 * time.Second},
		{name: "longest day multiple that fits", give: Limit{Unit: Day, Multiplier: 106751}, want: 106751 * 24 * time.Hour},
		{name: "one day past it", give: Limit{Unit: Day, Multiplier: 106752}, want: longest},
		// The reported case: 86400e9 ns x 616385997 wraps to 524ms.
		{name: "day times 616385997", give: Limit{Unit: Day, Multiplier: 616385997}, want: longest},
		{name: "year times max uint32", give: Limit{Unit: Year, Multiplier: math.MaxUint32}, want: longest},
		{name: "second times max uint32", give: Limit{Unit: Second, Multiplier: math.MaxUint32}, want: math.MaxUint32 * time.Second},
		{name: "unknown unit", give: Limit{Unit: UnitUnknown, Multiplier: math.MaxUint32}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.give.Window(); got != tt.want {
				t.Errorf("Window() = %v, want %v", got, tt.want)
			}
		})
	}
}

// FuzzLimitWindow: over every unit and multiplier, the window is the exact
// product when it fits and longest when not; never negative or shorter
// than the unit.
func FuzzLimitWindow(f *testing.F) {
	f.Add(uint8(Day), uint32(616385997))
	f.Add(uint8(Second), uint32(1))
	f.Add(uint8(Year), uint32(math.MaxUint32))
	f.Fuzz(func(t *testing.T, unit uint8, mult uint32) {
		l := Limit{Unit: Unit(unit), Multiplier: mult}
		u := Unit(unit).Duration()
		got := l.Window()
		if u <= 0 {
			if got != 0 {
				t.Fatalf("unit %d has no duration, Window() = %v", unit, got)
			}
			return
		}
		m := max(uint64(mult), 1)
		hi, lo := mulU64(uint64(u), m)
		want := longest
		if hi == 0 && lo <= math.MaxInt64 {
			want = time.Duration(lo)
		}
		if got != want || got < u {
			t.Fatalf("%d x %d: Window() = %v, want %v", unit, mult, got, want)
		}
	})
}

func mulU64(a, b uint64) (hi, lo uint64) {
	// Schoolbook on 32-bit halves, independent of the code under test.
	a1, a0, b1, b0 := a>>32, a&math.MaxUint32, b>>32, b&math.MaxUint32
	p00, p01, p10, p11 := a0*b0, a0*b1, a1*b0, a1*b1
	mid := p00>>32 + p01&math.MaxUint32 + p10&math.MaxUint32
	lo = mid<<32 | p00&math.MaxUint32
	hi = p11 + p01>>32 + p10>>32 + mid>>32
	return hi, lo
}
