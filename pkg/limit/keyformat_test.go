package limit

import (
	"testing"
	"time"
)

// TestKeyFormatPinned pins the exact bytes of every key Tollgate stores.
// Keys outlive a process: during a rolling update the new replicas must
// read and write the keys the old ones wrote, so a change here is a
// migration, not a refactor. The strings were taken from the code before
// the key format moved into this file.
func TestKeyFormatPinned(t *testing.T) {
	t.Parallel()
	e := []Entry{{Key: "tenant", Value: "acme"}, {Key: "model", Value: "gpt-4o"}}
	breaker := BreakerKey("tenant=acme", "upstream")
	for _, tt := range []struct {
		name string
		give string
		want string
	}{
		{name: "requests sliding", give: Key(Requests, SlidingWindow, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:rs60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "requests fixed", give: Key(Requests, FixedWindow, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:rf60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "requests token bucket", give: Key(Requests, TokenBucket, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:rt60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "requests concurrency", give: Key(Requests, Concurrency, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:rc60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "requests once", give: Key(Requests, Once, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:ro60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "tokens sliding", give: Key(Tokens, SlidingWindow, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:ts60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "tokens fixed", give: Key(Tokens, FixedWindow, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:tf60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "tokens token bucket", give: Key(Tokens, TokenBucket, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:tt60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "tokens concurrency", give: Key(Tokens, Concurrency, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:tc60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "tokens once", give: Key(Tokens, Once, time.Minute, "llm", e), want: "tg:{5a0ffbada6d12d76}:to60000:3:llm6:tenant4:acme5:model6:gpt-4o"},
		{name: "hostile value, empty domain", give: Key(Requests, SlidingWindow, 1500*time.Millisecond, "", []Entry{{Key: "k", Value: "a}{b\n:c"}}), want: "tg:{9d2a3dbbe41104d4}:rs1500:0:1:k7:a}{b\n:c"},
		{name: "reservation once mark", give: OnceKey("llm", e[:1], "req-1"), want: "tg:{5a0ffbada6d12d76}:o:3:llm5:req-1"},
		{name: "reservation once mark, no entries", give: OnceKey("llm", nil, "req-1"), want: "tg:{125b69191db94ab8}:o:3:llm5:req-1"},
		{name: "fair-share state", give: FairStateKey(Key(Requests, SlidingWindow, time.Minute, "llm", e[1:])), want: "tg:{319f649f6afc5d06}:rs60000:3:llm5:model6:gpt-4o:fair"},
		{name: "fixed window count", give: countKey(Key(Tokens, FixedWindow, time.Minute, "llm", e), time.Minute, 29402500*60000+59999), want: "tg:{5a0ffbada6d12d76}:tf60000:3:llm6:tenant4:acme5:model6:gpt-4o#29402500"},
		{name: "fixed window count, untagged key", give: countKey("f", time.Second, -1500), want: "{f}#-2"},
		{name: "fair-share member", give: FairMember("acme"), want: "0724d383f4f6de0f"},
		{name: "fair-share overflow member", give: FairMember(""), want: ""},
		{name: "breaker", give: breaker, want: "tg:{045521d06c094a87}:b:11:tenant=acme8:upstream"},
		{name: "breaker once marker", give: BreakerOnceKey(breaker, "req-1"), want: "tg:{045521d06c094a87}:b:11:tenant=acme8:upstream:once:req-1"},
		{name: "pressure board", give: BoardKey("global"), want: "tg:{pressure}:global"},
		{name: "pressure pushed", give: PushedKey("global"), want: "tg:{pressure}pushed:global"},
		{name: "flights", give: FlightsKey("llm/acme"), want: "tg:{c5f855db7364dd2d}:f:8:llm/acme"},
		{name: "flights, hostile scope", give: FlightsKey("a}{b"), want: "tg:{fc524af2bdb9eb7c}:f:4:a}{b"},
		{name: "meter bucket", give: MeterKey("llm/acme", 1000, 1764150000000), want: "tg:{a9f69eb4be42631e}:m:8:llm/acme:1000:1764150000000"},
		{name: "cell", give: CellKey("owed:acme"), want: "tg:{e1199ad6ed340097}:c:9:owed:acme"},
	} {
		if tt.give != tt.want {
			t.Errorf("%s: key %q, want %q", tt.name, tt.give, tt.want)
		}
	}
}

func countKey(key string, window time.Duration, at int64) string {
	k, ok := CountKey(&Charge{Key: key, Algorithm: FixedWindow, Window: window}, at)
	if !ok {
		return "(none)"
	}
	return k
}

// TestCountKeySlot checks that a window's count key hashes as its
// counter's key does, braced or not, and that a key braces cannot enclose
// has none.
func TestCountKeySlot(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"f", "a{b", "tg:{5a0ffbada6d12d76}:rf60000:3:llm", "x{y}z{w}"} {
		k, ok := CountKey(&Charge{Key: key, Window: time.Second}, 7000)
		if !ok || !Countable(key) {
			t.Errorf("CountKey(%q): none", key)
			continue
		}
		if HashTag(k) != HashTag(key) {
			t.Errorf("CountKey(%q) = %q: tag %q, want that of %q (%q)", key, k, HashTag(k), key, HashTag(key))
		}
		// CountKeys: the same key, and the next window's.
		ch := &Charge{Key: key, Window: time.Second}
		next, _ := CountKey(ch, 8000)
		if c, n, ok := CountKeys(ch, 7000); !ok || c != k || n != next {
			t.Errorf("CountKeys(%q, 7000) = %q, %q, %v; want %q, %q", key, c, n, ok, k, next)
		}
	}
	for _, key := range []string{"", "a}b", "{}x"} {
		if k, ok := CountKey(&Charge{Key: key, Window: time.Second}, 7000); ok || Countable(key) {
			t.Errorf("CountKey(%q) = %q, want none", key, k)
		}
		if c, n, ok := CountKeys(&Charge{Key: key, Window: time.Second}, 7000); ok {
			t.Errorf("CountKeys(%q) = %q, %q, want none", key, c, n)
		}
	}
}
