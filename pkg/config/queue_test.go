package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// TestParseQueue: queue: is read in priority order, and every mistake is
// reported at its line.
func TestParseQueue(t *testing.T) {
	t.Parallel()
	const tiers = "tiers: {key: tier, default: free, plans: {premium: 3, standard: 2, free: 1}}\n"
	tests := []struct {
		name    string
		give    string
		want    *limit.Queue
		wantErr string
	}{
		{name: "none", give: tiers, want: nil},
		{
			name: "tiers in order, a default and a poll",
			give: tiers + "queue:\n  max_wait: 1s\n  max_length: 5\n  poll: 50ms\n  tiers:\n" +
				"    - {tier: premium, skip: true}\n    - {tier: standard, max_wait: 4s, max_length: 200}\n",
			want: &limit.Queue{
				Default: limit.QueueTier{MaxWait: time.Second, MaxLength: 5},
				Poll:    50 * time.Millisecond,
				Tiers:   []limit.QueueTier{{Tier: "premium", Skip: true}, {Tier: "standard", MaxWait: 4 * time.Second, MaxLength: 200}},
			},
		},
		{
			name: "no tiers: one bound for every request",
			give: "queue: {max_wait: 3s, max_length: 10}\n",
			want: &limit.Queue{Default: limit.QueueTier{MaxWait: 3 * time.Second, MaxLength: 10}},
		},
		{name: "unbounded", give: "queue: {max_wait: 3s}\n", wantErr: "t.yaml:2: queue: max_length is required with max_wait: no queue is unbounded"},
		{name: "length without wait", give: "queue:\n  max_length: 3\n", wantErr: "t.yaml:3: queue.max_length: max_length needs max_wait"},
		{name: "wait too long", give: "queue: {max_wait: 31s, max_length: 1}\n", wantErr: "t.yaml:2: queue.max_wait: 31s is outside (0,30s]"},
		{name: "length zero", give: "queue: {max_wait: 1s, max_length: 0}\n", wantErr: "t.yaml:2: queue.max_length: 0 is less than 1"},
		{name: "poll too short", give: "queue: {max_wait: 1s, max_length: 1, poll: 1ms}\n", wantErr: "t.yaml:2: queue.poll: 1ms is outside 10ms..30s"},
		{name: "nothing waits", give: tiers + "queue:\n  tiers: [{tier: premium, skip: true}]\n", wantErr: "t.yaml:4: queue: no tier may wait"},
		{name: "tiers without tiers", give: "queue:\n  tiers: [{tier: premium, max_wait: 1s, max_length: 1}]\n", wantErr: "t.yaml:3: queue.tiers: needs the file's tiers"},
		{
			name:    "unknown plan",
			give:    tiers + "queue:\n  tiers:\n    - {tier: gold, max_wait: 1s, max_length: 1}\n",
			wantErr: `t.yaml:5: queue.tiers[0].tier: "gold" is not one of the plans (free|premium|standard)`,
		},
		{
			name:    "tier twice",
			give:    tiers + "queue:\n  tiers:\n    - {tier: free, max_wait: 1s, max_length: 1}\n    - {tier: free, max_wait: 2s, max_length: 1}\n",
			wantErr: `t.yaml:6: queue.tiers[1].tier: "free" is listed already (line 5)`,
		},
		{name: "tier without bound", give: tiers + "queue:\n  tiers:\n    - {tier: free}\n", wantErr: "t.yaml:5: queue.tiers[0]: max_wait is required"},
		{name: "unknown key", give: "queue: {max_wait: 1s, max_length: 1, maxlength: 2}\n", wantErr: "queue.maxlength: unknown key; did you mean max_length?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse("t.yaml", []byte("domain: d\n"+tt.give+"descriptors:\n  - {key: tenant, rate_limit: {unit: minute, requests_per_unit: 1}}\n"))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(d.Queue, tt.want) {
				t.Errorf("Queue = %+v, want %+v", d.Queue, tt.want)
			}
		})
	}
}
