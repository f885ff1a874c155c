package headers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAppend(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give []Quota
		want []Header
	}{
		{name: "nothing", give: nil, want: nil},
		{name: "no limit, not over", give: []Quota{{}}, want: nil},
		{
			name: "one limit",
			give: []Quota{{HasLimit: true, Amount: 10, WindowSeconds: 60, Name: "per-tenant", Remaining: 9, Reset: 59500 * time.Millisecond}},
			want: []Header{{Limit, `10, 10;w=60;name="per-tenant"`}, {Remaining, "9"}, {Reset, "60"}},
		},
		{
			name: "the least remaining wins, the first on a tie, and every limit is a policy",
			give: []Quota{
				{HasLimit: true, Amount: 100, WindowSeconds: 3600, Remaining: 5, Reset: time.Hour},
				{HasLimit: true, Amount: 10, WindowSeconds: 1, Remaining: 5, Reset: time.Second},
				{HasLimit: false},
			},
			want: []Header{{Limit, "100, 100;w=3600, 10;w=1"}, {Remaining, "5"}, {Reset, "3600"}},
		},
		{
			name: "over: the denying quota is reported even with more room than a looser one",
			give: []Quota{
				{HasLimit: true, Amount: 10000, WindowSeconds: 60, Name: "bucket", Remaining: 500, Reset: time.Second},
				{HasLimit: true, Amount: 3000, WindowSeconds: 3600, Name: "tokens", Remaining: 984, Reset: 3743 * time.Second, Over: true},
			},
			want: []Header{{Limit, `3000, 10000;w=60;name="bucket", 3000;w=3600;name="tokens"`}, {Remaining, "984"}, {Reset, "3743"}, {RetryAfter, "3743"}},
		},
		{
			name: "over: retry-after is the longest wait among the denials, at least 1 s",
			give: []Quota{
				{HasLimit: true, Amount: 5, WindowSeconds: 60, Remaining: 0, Reset: 1500 * time.Millisecond, Over: true},
				{HasLimit: true, Amount: 7, WindowSeconds: 60, Remaining: 3, Reset: 40 * time.Second},
				{HasLimit: true, Amount: 8, WindowSeconds: 60, Remaining: 0, Reset: 0, Over: true},
			},
			want: []Header{{Limit, "5, 5;w=60, 7;w=60, 8;w=60"}, {Remaining, "0"}, {Reset, "2"}, {RetryAfter, "2"}},
		},
		{
			name: "a denial without a limit (a concurrency cap) adds only retry-after",
			give: []Quota{{Over: true, Reset: 30 * time.Second}},
			want: []Header{{RetryAfter, "30"}},
		},
		{
			name: "an unknown window leaves the policy out; names are escaped and kept printable",
			give: []Quota{{HasLimit: true, Amount: 3, Remaining: 1, Name: "x"}, {HasLimit: true, Amount: 4, WindowSeconds: 1, Remaining: 2, Name: "a\"b\\c\n"}},
			want: []Header{{Limit, `3, 4;w=1;name="a\"b\\c"`}, {Remaining, "1"}, {Reset, "0"}},
		},
		{
			name: "a denial the request can never fit: its figures, no reset, no retry-after, and the reason",
			give: []Quota{
				{HasLimit: true, Amount: 5, WindowSeconds: 60, Remaining: 0, Reset: 40 * time.Second, Over: true},
				{HasLimit: true, Amount: 1000, WindowSeconds: 3600, Name: "tokens", Remaining: 1000, Reset: time.Hour, Over: true, TooLarge: true},
			},
			want: []Header{{Limit, `1000, 5;w=60, 1000;w=3600;name="tokens"`}, {Remaining, "1000"}, {Reason, ReasonTooLarge}, {ShouldRetry, "false"}},
		},
		{
			name: "amounts past 32 bits",
			give: []Quota{{HasLimit: true, Amount: 1 << 40, WindowSeconds: 2592000, Remaining: 1 << 39, Reset: time.Minute}},
			want: []Header{{Limit, "1099511627776, 1099511627776;w=2592000"}, {Remaining, "549755813888"}, {Reset, "60"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, Append(nil, tt.give)); diff != "" {
				t.Errorf("Append (-want +got):\n%s", diff)
			}
		})
	}
}
