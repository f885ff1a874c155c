package replicas

import (
	"testing"
	"time"
)

func TestMaxSurelyInWindow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		give   []call
		want   int
		wantAt time.Duration
	}{
		{name: "none", give: nil, want: 0, wantAt: 0},
		{name: "all inside", give: []call{{5, 6}, {0, 1}, {1, 2}}, want: 3, wantAt: 0},
		{name: "receive at the end is outside", give: []call{{0, 1}, {5, 10}}, want: 1, wantAt: 0},
		{name: "straddler counts in no window", give: []call{{0, 1}, {2, 3}, {9, 11}}, want: 2, wantAt: 0},
		{name: "best window starts later", give: []call{{0, 1}, {3, 4}, {10, 11}, {12, 12}}, want: 3, wantAt: 3},
		{name: "slow call inside its own window only", give: []call{{1, 9}, {2, 3}, {4, 5}}, want: 3, wantAt: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, at := maxSurelyInWindow(tt.give, 10)
			if got != tt.want || at != tt.wantAt {
				t.Fatalf("maxSurelyInWindow = %d at %v, want %d at %v", got, at, tt.want, tt.wantAt)
			}
		})
	}
}
