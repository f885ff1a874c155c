package load

import (
	"encoding/binary"
	"os"
	"strings"
	"testing"
)

func TestRedisCPU(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    string
		want    float64
		wantErr string
	}{
		{
			name: "reply",
			give: "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.000000\r\n" +
				"used_cpu_user_children:9.000000\r\nused_cpu_sys_main_thread:1.000000\r\nused_cpu_user_main_thread:2.000000\r\n",
			want: 3.75,
		},
		{name: "no user", give: "# CPU\r\nused_cpu_sys:1.25\r\n", wantErr: "lacks"},
		{name: "garbage", give: "used_cpu_sys:x\r\nused_cpu_user:1\r\n", wantErr: `used_cpu_sys "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := redisCPU(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("redisCPU = %v, %v, want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("redisCPU = %v, %v, want %v", got, err, tt.want)
			}
		})
	}
}

func TestProcStatTicks(t *testing.T) {
	t.Parallel()
	// Fields 14 and 15 (utime 700, stime 35) after a command name that
	// holds spaces and a ')'.
	const tail = " S 1 7 7 0 -1 4194560 900 0 3 0 700 35 4 2 20 0 6 0 1000 2000000 500 18446744073709551615\n"
	tests := []struct {
		name    string
		give    string
		want    int64
		wantErr string
	}{
		{name: "plain", give: "7 (tollgate)" + tail, want: 735},
		{name: "odd name", give: "7 (a b) (c)" + tail, want: 735},
		{name: "short", give: "7 (x) S 1 2 3\n", wantErr: "fields"},
		{name: "no name", give: "7 x S", wantErr: "no ')'"},
		{name: "garbage", give: "7 (x) S 1 7 7 0 -1 4194560 900 0 3 0 seven 35 4\n", wantErr: `"seven"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := procStatTicks(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("procStatTicks = %d, %v, want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("procStatTicks = %d, %v, want %d", got, err, tt.want)
			}
		})
	}
	// This process's own line parses.
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		if _, err := procStatTicks(string(b)); err != nil {
			t.Errorf("/proc/self/stat: %v", err)
		}
	}
}

func TestAuxvClockTicks(t *testing.T) {
	t.Parallel()
	auxv := func(pairs ...uint64) []byte {
		b := make([]byte, 0, 8*len(pairs))
		for _, v := range pairs {
			b = binary.NativeEndian.AppendUint64(b, v)
		}
		return b
	}
	if got := auxvClockTicks(auxv(6, 4096, atClkTck, 250, 0, 0)); got != 250 {
		t.Errorf("AT_CLKTCK 250: got %d", got)
	}
	if got := auxvClockTicks(auxv(6, 4096, 0, 0, atClkTck, 250)); got != 100 {
		t.Errorf("AT_CLKTCK after AT_NULL: got %d, want the default 100", got)
	}
	if got := auxvClockTicks(nil); got != 100 {
		t.Errorf("empty: got %d, want 100", got)
	}
	if got := clockTicks(); got <= 0 {
		t.Errorf("clockTicks = %d", got)
	}
}
