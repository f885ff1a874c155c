package reservation

import (
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

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give *Reservation
	}{
		{
			name: "typical",
			give: &Reservation{
				ID: "req-1.0011223344556677", Domain: "inference", Tokens: 1234, At: time.UnixMilli(1_800_000_000_123),
				Descriptors: []limit.Descriptor{
					{Entries: entries("tenant", "acme")},
					{Entries: entries("tenant", "acme", "model", "gpt-4o")},
				},
				Overrides: map[string]limit.Override{
					"b_tokens": {Amount: 5, Unit: limit.Hour, Multiplier: 2},
					"a":        {Amount: 0},
				},
			},
		},
		{
			name: "bytes of every kind, before 1970",
			give: &Reservation{
				ID: "\x00}{:\n", Domain: "d", Tokens: 1 << 53, At: time.UnixMilli(-5),
				Descriptors: []limit.Descriptor{{Entries: entries("k\x00", "v\xff|", "", "")}},
			},
		},
		{name: "empty", give: &Reservation{At: time.UnixMilli(0)}},
		{
			// Past the buffer Encode starts on the stack.
			name: "long values",
			give: &Reservation{ID: strings.Repeat("i", 300), Domain: "d", At: time.UnixMilli(3),
				Descriptors: []limit.Descriptor{{Entries: entries("tenant", strings.Repeat("t", 1000), "model", strings.Repeat("m", 900))}}},
		},
		{
			name: "with a tier",
			give: &Reservation{ID: "r", Domain: "d", At: time.UnixMilli(2), Tier: "premium",
				Descriptors: []limit.Descriptor{{Entries: entries("tenant", "acme")}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := Encode(tt.give)
			if strings.ContainsAny(s, "+/=") {
				t.Errorf("Encode = %q is not unpadded base64url", s)
			}
			got, err := Decode(s)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := cmp.Diff(tt.give, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if again := Encode(got); again != s {
				t.Errorf("Encode is not a function of the reservation: %q then %q", s, again)
			}
		})
	}
}

func TestRequest(t *testing.T) {
	t.Parallel()
	r := &Reservation{ID: "i", Domain: "d", Tokens: 9, At: time.UnixMilli(1),
		Descriptors: []limit.Descriptor{{Entries: entries("a", "b")}}, Overrides: map[string]limit.Override{"x": {Amount: 1}}, Tier: "free"}
	want := &limit.Request{ID: "i", Domain: "d", Descriptors: r.Descriptors, Overrides: r.Overrides, Tier: "free"}
	if diff := cmp.Diff(want, r.Request()); diff != "" {
		t.Errorf("Request (-want +got):\n%s", diff)
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	enc := func(b ...byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	good := Encode(&Reservation{ID: "i", Domain: "d", At: time.UnixMilli(1), Descriptors: []limit.Descriptor{{Entries: entries("a", "b")}}})
	raw, _ := base64.RawURLEncoding.DecodeString(good)
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "empty", give: "", want: "invalid reservation ticket: truncated"},
		{name: "not base64url", give: "a+b/", want: "invalid reservation ticket: not base64url"},
		{name: "padded", give: good + "=", want: "invalid reservation ticket: not base64url"},
		{name: "another version", give: enc(3, 0, 0), want: "invalid reservation ticket: version 3, want 1 or 2"},
		{name: "version 2 without its tier", give: enc(append([]byte{2}, raw[1:]...)...), want: "invalid reservation ticket: truncated or overlong number"},
		{name: "truncated", give: enc(raw[:len(raw)-1]...), want: "invalid reservation ticket: truncated or overlong number"},
		{name: "truncated in a string", give: enc(raw[:len(raw)-2]...), want: "invalid reservation ticket: truncated entry value"},
		{name: "trailing bytes", give: enc(append(raw[:len(raw):len(raw)], 0)...), want: "invalid reservation ticket: 1 bytes after the end"},
		{name: "overlong number", give: enc(1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), want: "invalid reservation ticket: truncated or overlong number"},
		{name: "a string longer than the ticket", give: enc(1, 0, 0, 100, 'x'), want: "invalid reservation ticket: truncated id"},
		{name: "a huge string length", give: enc(1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f), want: "invalid reservation ticket: id is 4294967295 bytes, at most 1024"},
		{name: "too many descriptors", give: enc(1, 0, 0, 0, 0, 65), want: "invalid reservation ticket: 65 descriptors, at most 64"},
		{name: "too many entries", give: enc(1, 0, 0, 0, 0, 1, 33), want: "invalid reservation ticket: 33 entries, at most 32"},
		{name: "a bad unit", give: enc(1, 0, 0, 0, 0, 0, 1, 1, 'n', 1, 8, 1), want: "invalid reservation ticket: override unit 8"},
		{name: "too long", give: strings.Repeat("A", MaxEncodedBytes+1), want: "invalid reservation ticket: 65537 bytes, at most 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode(tt.give)
			if err == nil || !errors.Is(err, ErrInvalid) || err.Error() != tt.want {
				t.Errorf("Decode error = %v, want %q", err, tt.want)
			}
		})
	}
}

// FuzzDecode: a ticket crosses Envoy, so Decode takes any string without a
// panic, and what it accepts encodes back to a ticket that decodes the same.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(&Reservation{ID: "r", Domain: "d", Tokens: 3, At: time.UnixMilli(7),
		Descriptors: []limit.Descriptor{{Entries: entries("tenant", "a", "model", "m")}},
		Overrides:   map[string]limit.Override{"x": {Amount: 1, Unit: limit.Minute, Multiplier: 1}}}))
	f.Add("")
	f.Add("AQ")
	f.Add("AQAAAAAA")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Decode(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again, err := Decode(Encode(r))
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)): %v", r, err)
		}
		if diff := cmp.Diff(r, again); diff != "" {
			t.Fatalf("re-encoding changed the reservation (-first +second):\n%s", diff)
		}
	})
}
