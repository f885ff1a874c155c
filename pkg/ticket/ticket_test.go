package ticket

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

func entries(kv ...string) []limit.Entry {
	var es []limit.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, limit.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func key(b byte) []byte { return bytes.Repeat([]byte{b}, MinKeyBytes) }

func mustKeys(t testing.TB, current []byte, previous ...[]byte) *Keys {
	t.Helper()
	k, err := NewKeys(current, previous...)
	if err != nil {
		t.Fatalf("NewKeys: %v", err)
	}
	return k
}

func mustSealer(t testing.TB, k *Keys) *Sealer {
	t.Helper()
	s, err := NewSealer(k, 0)
	if err != nil {
		t.Fatalf("NewSealer: %v", err)
	}
	return s
}

var now = time.UnixMilli(1_800_000_000_123)

func typical() *Ticket {
	return &Ticket{
		ID: "req-1.00112233445566778899aabbccddeeff", Domain: "inference", Tier: "premium", Model: "gpt-4o",
		Reserved: true, Tokens: 1234, Prompt: 978, At: now,
		Descriptors: []limit.Descriptor{
			{Entries: entries("tenant", "acme")},
			{Entries: entries("tenant", "acme", "model", "gpt-4o")},
		},
		Overrides: map[string]limit.Override{
			"b_tokens": {Amount: 5, Unit: limit.Hour, Multiplier: 2},
			"a":        {Amount: 0},
		},
		Probes: []limit.Probe{{Key: "model", Name: "gpt-4o", ID: "1799.0123456789abcdef0123456789abcdef"}},
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	s := mustSealer(t, mustKeys(t, key(1)))
	tests := []struct {
		name string
		give *Ticket
	}{
		{name: "typical", give: typical()},
		{name: "bytes of every kind", give: &Ticket{ID: "\x00}{:\n", Domain: "d", Tokens: 1 << 53, At: now.Add(-time.Minute),
			Descriptors: []limit.Descriptor{{Entries: entries("k\x00", "v\xff|", "", "")}}}},
		{name: "nothing reserved", give: &Ticket{ID: "r", Domain: "d", At: now}},
		{
			// Past the buffer Seal starts on the stack.
			name: "long values",
			give: &Ticket{ID: strings.Repeat("i", 300), Domain: "d", At: now,
				Descriptors: []limit.Descriptor{{Entries: entries("tenant", strings.Repeat("t", 1000), "model", strings.Repeat("m", 900))}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			str := s.Seal(tt.give)
			if strings.ContainsAny(str, "+/=") {
				t.Errorf("Seal = %q is not unpadded base64url", str)
			}
			got, err := s.Open(str, now)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if diff := cmp.Diff(tt.give, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if again := s.Seal(got); again != str {
				t.Errorf("Seal is not a function of the ticket: %q then %q", str, again)
			}
		})
	}
}

// Every single-bit change of a sealed ticket, in its contents or its tag,
// is refused as forged: nothing in it can be altered.
func TestOpenRefusesEveryAlteredBit(t *testing.T) {
	t.Parallel()
	s := mustSealer(t, mustKeys(t, key(1)))
	raw, err := base64.RawURLEncoding.DecodeString(s.Seal(typical()))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(raw); i++ { // byte 0 is the version: malformed, tested below
		for bit := range 8 {
			b := bytes.Clone(raw)
			b[i] ^= 1 << bit
			_, err := s.Open(base64.RawURLEncoding.EncodeToString(b), now)
			if !errors.Is(err, ErrForged) {
				t.Fatalf("byte %d bit %d flipped: Open = %v, want ErrForged", i, bit, err)
			}
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	mine := mustSealer(t, mustKeys(t, key(1)))
	theirs := mustSealer(t, mustKeys(t, key(2)))
	sealed := mine.Seal(typical())
	raw, _ := base64.RawURLEncoding.DecodeString(sealed)
	old := typical()
	old.At = now.Add(-DefaultMaxAge - time.Second)
	future := typical()
	future.At = now.Add(2 * time.Minute)
	v2 := bytes.Clone(raw)
	v2[0] = 2
	tests := []struct {
		name string
		give string
		want error
	}{
		{name: "empty", give: "", want: ErrMalformed},
		{name: "not base64", give: "!!!", want: ErrMalformed},
		{name: "too long", give: strings.Repeat("A", MaxEncodedBytes+1), want: ErrMalformed},
		{name: "an unsigned ticket of the old format", give: base64.RawURLEncoding.EncodeToString(v2), want: ErrMalformed},
		{name: "tag only", give: base64.RawURLEncoding.EncodeToString(append([]byte{version}, make([]byte, tagBytes)...)), want: ErrForged},
		{name: "sealed under another key", give: theirs.Seal(typical()), want: ErrForged},
		{name: "tag cut off", give: base64.RawURLEncoding.EncodeToString(raw[:len(raw)-1]), want: ErrForged},
		{name: "older than the max age", give: mine.Seal(old), want: ErrExpired},
		{name: "from the future", give: mine.Seal(future), want: ErrExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := mine.Open(tt.give, now)
			if !errors.Is(err, tt.want) || !errors.Is(err, ErrRejected) || got != nil {
				t.Errorf("Open = %v, %v; want nil, %v", got, err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), tt.give) && tt.give != "" {
				t.Errorf("the error quotes the ticket: %v", err)
			}
		})
	}
}

// A rotation: the new key first, the old one after it. Tickets sealed
// before the swap still open; new ones are sealed with the new key, which
// replicas still on the old key alone refuse.
func TestRotation(t *testing.T) {
	t.Parallel()
	s := mustSealer(t, mustKeys(t, key(1)))
	before := s.Seal(typical())
	s.SetKeys(mustKeys(t, key(2), key(1)))
	if _, err := s.Open(before, now); err != nil {
		t.Errorf("a ticket sealed before the rotation: %v", err)
	}
	after := s.Seal(typical())
	if _, err := s.Open(after, now); err != nil {
		t.Errorf("a ticket sealed after the rotation: %v", err)
	}
	if _, err := mustSealer(t, mustKeys(t, key(1))).Open(after, now); !errors.Is(err, ErrForged) {
		t.Errorf("the old key alone opened a ticket sealed with the new one: %v", err)
	}
	s.SetKeys(mustKeys(t, key(2)))
	if _, err := s.Open(before, now); !errors.Is(err, ErrForged) {
		t.Errorf("the retired key still opens: %v", err)
	}
}

func TestParseKeys(t *testing.T) {
	t.Parallel()
	k32 := base64.StdEncoding.EncodeToString(key(7))
	k32url := base64.RawURLEncoding.EncodeToString(append(key(8)[:31], 0xfb)) // has - or _
	short := base64.StdEncoding.EncodeToString(key(9)[:16])
	tests := []struct {
		name    string
		give    string
		wantLen int
		wantErr string
	}{
		{name: "one key", give: k32 + "\n", wantLen: 1},
		{name: "current and previous, comments and blanks", give: "# rotated 2026-11-26\n" + k32 + "\n\n  " + k32url + "  \n", wantLen: 2},
		{name: "empty", give: "# nothing\n", wantErr: "keys.txt: holds no key"},
		{name: "short key", give: k32 + "\n" + short + "\n", wantErr: "keys.txt:2: key is 16 bytes, at least 32"},
		{name: "not base64", give: "not*base64\n", wantErr: "keys.txt:1: key is not base64"},
		{name: "too many", give: strings.Repeat(k32+"\n", MaxKeys+1), wantErr: "holds 5 keys, at most 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := ParseKeys("keys.txt", []byte(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseKeys = %v, want an error containing %q", err, tt.wantErr)
				}
				for _, line := range strings.Split(tt.give, "\n") {
					if len(line) > 8 && strings.Contains(err.Error(), strings.TrimSpace(line)) {
						t.Errorf("the error quotes a line of the key file: %v", err)
					}
				}
				return
			}
			if err != nil || k.Len() != tt.wantLen {
				t.Fatalf("ParseKeys = %v keys, %v; want %d", k, err, tt.wantLen)
			}
		})
	}
	a, _ := ParseKeys("a", []byte(k32))
	b, _ := ParseKeys("b", []byte(k32+"\n"+k32url))
	if a.ID() != b.ID() || a.ID() == RandomKeys().ID() {
		t.Errorf("key IDs: %q %q: the same current key must give the same ID, another key another", a.ID(), b.ID())
	}
}

func FuzzOpen(f *testing.F) {
	s := mustSealer(f, mustKeys(f, key(1)))
	f.Add(s.Seal(typical()))
	f.Add(s.Seal(&Ticket{ID: "r", Domain: "d", At: now}))
	f.Add("")
	f.Add("AwAA")
	f.Fuzz(func(t *testing.T, str string) {
		got, err := s.Open(str, now)
		if err != nil {
			if !errors.Is(err, ErrRejected) || got != nil {
				t.Fatalf("Open = %v, %v", got, err)
			}
			return
		}
		// Only what this key sealed opens, and it reseals to itself.
		if again := s.Seal(got); again != str {
			t.Fatalf("opened %q, which reseals as %q", str, again)
		}
	})
}

func BenchmarkSeal(b *testing.B) {
	s := mustSealer(b, mustKeys(b, key(1)))
	t := typical()
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Seal(t)
	}
}

func BenchmarkOpen(b *testing.B) {
	s := mustSealer(b, mustKeys(b, key(1)))
	str := s.Seal(typical())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Open(str, now); err != nil {
			b.Fatal(err)
		}
	}
}
