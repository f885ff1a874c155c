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
			want: []Header{
				{Limit, `10, 10;w=60;name="per-tenant"`}, {Remaining, "9"}, {Reset, "60"},
				{LimitRequests, "10"}, {RemainingRequests, "9"}, {ResetRequests, "59.5s"},
			},
		},
		{
			name: "the least remaining wins, the first on a tie, and every limit is a policy",
			give: []Quota{
				{HasLimit: true, Amount: 100, WindowSeconds: 3600, Remaining: 5, Reset: time.Hour},
				{HasLimit: true, Amount: 10, WindowSeconds: 1, Remaining: 5, Reset: time.Second},
				{HasLimit: false},
			},
			want: []Header{
				{Limit, "100, 100;w=3600, 10;w=1"}, {Remaining, "5"}, {Reset, "3600"},
				{LimitRequests, "100"}, {RemainingRequests, "5"}, {ResetRequests, "1h0m0s"},
			},
		},
		{
			name: "over: the denying quota is reported even with more room than a looser one",
			give: []Quota{
				{HasLimit: true, Amount: 10000, WindowSeconds: 60, Name: "bucket", Remaining: 500, Reset: time.Second},
				{HasLimit: true, Amount: 3000, WindowSeconds: 3600, Name: "tokens", Remaining: 984, Reset: 3743 * time.Second, Over: true, Tokens: true},
			},
			want: []Header{
				{Limit, `3000, 10000;w=60;name="bucket", 3000;w=3600;name="tokens"`}, {Remaining, "984"}, {Reset, "3743"}, {RetryAfter, "3743"},
				{LimitRequests, "10000"}, {RemainingRequests, "500"}, {ResetRequests, "1s"},
				{LimitTokens, "3000"}, {RemainingTokens, "984"}, {ResetTokens, "1h2m23s"},
			},
		},
		{
			name: "over: retry-after is the longest wait among the denials, at least 1 s",
			give: []Quota{
				{HasLimit: true, Amount: 5, WindowSeconds: 60, Remaining: 0, Reset: 1500 * time.Millisecond, Over: true},
				{HasLimit: true, Amount: 7, WindowSeconds: 60, Remaining: 3, Reset: 40 * time.Second},
				{HasLimit: true, Amount: 8, WindowSeconds: 60, Remaining: 0, Reset: 0, Over: true},
			},
			want: []Header{
				{Limit, "5, 5;w=60, 7;w=60, 8;w=60"}, {Remaining, "0"}, {Reset, "2"}, {RetryAfter, "2"},
				{LimitRequests, "5"}, {RemainingRequests, "0"}, {ResetRequests, "1.5s"},
			},
		},
		{
			name: "a denial without a limit (a concurrency cap) adds only retry-after",
			give: []Quota{{Over: true, Reset: 30 * time.Second}},
			want: []Header{{RetryAfter, "30"}},
		},
		{
			name: "an unknown window leaves the policy out; names are escaped and kept printable",
			give: []Quota{{HasLimit: true, Amount: 3, Remaining: 1, Name: "x"}, {HasLimit: true, Amount: 4, WindowSeconds: 1, Remaining: 2, Name: "a\"b\\c\n"}},
			want: []Header{
				{Limit, `3, 4;w=1;name="a\"b\\c"`}, {Remaining, "1"}, {Reset, "0"},
				{LimitRequests, "3"}, {RemainingRequests, "1"}, {ResetRequests, "0s"},
			},
		},
		{
			name: "a denial the request can never fit: its figures, no reset, no retry-after, and the reason",
			give: []Quota{
				{HasLimit: true, Amount: 5, WindowSeconds: 60, Remaining: 0, Reset: 40 * time.Second, Over: true},
				{HasLimit: true, Amount: 1000, WindowSeconds: 3600, Name: "tokens", Remaining: 1000, Reset: time.Hour, Over: true, TooLarge: true, Tokens: true},
			},
			want: []Header{
				{Limit, `1000, 5;w=60, 1000;w=3600;name="tokens"`}, {Remaining, "1000"},
				{LimitRequests, "5"}, {RemainingRequests, "0"},
				{LimitTokens, "1000"}, {RemainingTokens, "1000"},
				{Reason, ReasonTooLarge}, {ShouldRetry, "false"},
			},
		},
		{
			name: "amounts past 32 bits",
			give: []Quota{{HasLimit: true, Amount: 1 << 40, WindowSeconds: 2592000, Remaining: 1 << 39, Reset: time.Minute}},
			want: []Header{
				{Limit, "1099511627776, 1099511627776;w=2592000"}, {Remaining, "549755813888"}, {Reset, "60"},
				{LimitRequests, "1099511627776"}, {RemainingRequests, "549755813888"}, {ResetRequests, "1m0s"},
			},
		},
		{
			name: "admitted with both kinds: each kind's least room, the draft-03 trio the least of all",
			give: []Quota{
				{HasLimit: true, Amount: 100, WindowSeconds: 60, Name: "rpm", Remaining: 99, Reset: 59 * time.Second},
				{HasLimit: true, Amount: 30000, WindowSeconds: 60, Name: "tpm", Remaining: 28992, Reset: 1500 * time.Millisecond, Tokens: true},
				{HasLimit: true, Amount: 1000000, WindowSeconds: 86400, Name: "tpd", Remaining: 8, Reset: 6 * time.Hour, Tokens: true},
				{HasLimit: true, Amount: 10, WindowSeconds: 1, Remaining: 9, Reset: 12 * time.Millisecond},
			},
			want: []Header{
				{Limit, `1000000, 100;w=60;name="rpm", 30000;w=60;name="tpm", 1000000;w=86400;name="tpd", 10;w=1`}, {Remaining, "8"}, {Reset, "21600"},
				{LimitRequests, "10"}, {RemainingRequests, "9"}, {ResetRequests, "12ms"},
				{LimitTokens, "1000000"}, {RemainingTokens, "8"}, {ResetTokens, "6h0m0s"},
			},
		},
		{
			name: "a token budget denies: its figures in both the trio and the -tokens headers, the requests' beside",
			give: []Quota{
				{HasLimit: true, Amount: 100, WindowSeconds: 60, Name: "rpm", Remaining: 42, Reset: 30 * time.Second},
				{HasLimit: true, Amount: 3000, WindowSeconds: 3600, Name: "tenant_gpt4o_tokens", Remaining: 0, Reset: 3742400 * time.Millisecond, Over: true, Tokens: true},
			},
			want: []Header{
				{Limit, `3000, 100;w=60;name="rpm", 3000;w=3600;name="tenant_gpt4o_tokens"`}, {Remaining, "0"}, {Reset, "3743"}, {RetryAfter, "3743"},
				{LimitRequests, "100"}, {RemainingRequests, "42"}, {ResetRequests, "30s"},
				{LimitTokens, "3000"}, {RemainingTokens, "0"}, {ResetTokens, "1h2m22.4s"},
			},
		},
		{
			name: "only a token budget: no -requests headers",
			give: []Quota{{HasLimit: true, Amount: 500, WindowSeconds: 60, Remaining: 400, Reset: time.Nanosecond, Tokens: true}},
			want: []Header{
				{Limit, "500, 500;w=60"}, {Remaining, "400"}, {Reset, "1"},
				{LimitTokens, "500"}, {RemainingTokens, "400"}, {ResetTokens, "1ms"},
			},
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

// TestAppendDuration holds the resets to OpenAI's format, which is
// time.Duration's String, after rounding up to the millisecond.
func TestAppendDuration(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{
		-time.Second, 0, 1, time.Millisecond, 12 * time.Millisecond, 999*time.Millisecond + 1, time.Second,
		1500 * time.Millisecond, 7660 * time.Millisecond, 7661 * time.Millisecond, 7606 * time.Millisecond,
		time.Minute, 6 * time.Minute, 179560 * time.Millisecond, time.Hour, 3743*time.Second + 1,
		30 * 24 * time.Hour, 1<<63 - 1,
	} {
		want := "0s"
		if d > 0 {
			want = ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
		}
		if d == 1<<63-1 { // rounded up, it is past the longest Duration, which String cannot show
			want = "2562047h47m16.855s"
		}
		if got := string(appendDuration(nil, d)); got != want {
			t.Errorf("appendDuration(%d) = %q, want %q", d, got, want)
		}
	}
}

// TestMaxAppended: the bound callers size their arrays by holds for the
// most headers Append can give.
func TestMaxAppended(t *testing.T) {
	t.Parallel()
	q := []Quota{
		{HasLimit: true, Amount: 1, WindowSeconds: 1, Over: true, Reset: time.Second},
		{HasLimit: true, Amount: 1, WindowSeconds: 1, Tokens: true},
	}
	if got := len(Append(nil, q)); got != MaxAppended {
		t.Errorf("Append gave %d headers, want MaxAppended = %d", got, MaxAppended)
	}
	q[0].TooLarge = true
	if got := len(Append(nil, q)); got > MaxAppended {
		t.Errorf("Append gave %d headers for a request too large, more than MaxAppended = %d", got, MaxAppended)
	}
}
