package limit

import (
	"strings"
	"testing"
	"time"
)

func TestKeyInjective(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b []Entry
	}{
		{"separator in value", []Entry{{"a", "b:1:c"}}, []Entry{{"a", "b"}, {"c", ""}}},
		{"split across key and value", []Entry{{"ab", "c"}}, []Entry{{"a", "bc"}}},
		{"length digits in value", []Entry{{"k", "1:x"}}, []Entry{{"k", "1"}, {"x", ""}}},
		{"braces and newlines", []Entry{{"k", "}{\n"}}, []Entry{{"k", "}{"}, {"\n", ""}}},
		{"empty value vs none", []Entry{{"k", ""}}, []Entry{{"k", ""}, {"k", ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ka := Key(Requests, SlidingWindow, time.Minute, "d", tt.a)
			kb := Key(Requests, SlidingWindow, time.Minute, "d", tt.b)
			if ka == kb {
				t.Fatalf("%v and %v share key %q", tt.a, tt.b, ka)
			}
		})
	}
}

func TestKeyDistinguishesWhatItCounts(t *testing.T) {
	t.Parallel()
	e := []Entry{{"tenant", "acme"}}
	keys := map[string]string{}
	for _, give := range []struct {
		name string
		kind Kind
		alg  Algorithm
		win  time.Duration
		dom  string
	}{
		{"base", Requests, SlidingWindow, time.Minute, "d"},
		{"tokens", Tokens, SlidingWindow, time.Minute, "d"},
		{"fixed", Requests, FixedWindow, time.Minute, "d"},
		{"bucket", Requests, TokenBucket, time.Minute, "d"},
		{"hour", Requests, SlidingWindow, time.Hour, "d"},
		{"domain", Requests, SlidingWindow, time.Minute, "e"},
	} {
		k := Key(give.kind, give.alg, give.win, give.dom, e)
		if prev, dup := keys[k]; dup {
			t.Errorf("%s and %s share key %q", give.name, prev, k)
		}
		keys[k] = give.name
	}
}

func TestKeyHashTagSharedByFamily(t *testing.T) {
	t.Parallel()
	a := Key(Requests, SlidingWindow, time.Minute, "d", []Entry{{"tenant", "acme"}})
	b := Key(Tokens, TokenBucket, time.Hour, "d", []Entry{{"tenant", "acme"}, {"model", "m}{"}})
	c := Key(Requests, SlidingWindow, time.Minute, "d", []Entry{{"tenant", "other"}})
	if HashTag(a) != HashTag(b) {
		t.Errorf("same first entry, different tags: %q %q", HashTag(a), HashTag(b))
	}
	if HashTag(a) == HashTag(c) {
		t.Errorf("different tenants share tag %q", HashTag(a))
	}
	if got := HashTag(a); len(got) != 16 || strings.ContainsAny(got, "{}") {
		t.Errorf("tag %q is not 16 hex digits", got)
	}
}

func TestHashTag(t *testing.T) {
	t.Parallel()
	tests := []struct{ give, want string }{
		{"tg:{abc}:x", "abc"},
		{"{}abc", "{}abc"},
		{"no tag", "no tag"},
		{"open{only", "open{only"},
		{"a{b}{c}", "b"},
	}
	for _, tt := range tests {
		if got := HashTag(tt.give); got != tt.want {
			t.Errorf("HashTag(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

// FuzzKey checks that two different descriptors never share a key, for
// any bytes, and that the caps reject what is too large with ErrInvalid.
func FuzzKey(f *testing.F) {
	f.Add("tenant", "acme", "model", "gpt-4o", "tenant", "acme:model")
	f.Add("a", "}{", "\n", "", "a", "}{\n")
	f.Add("k", "1:x", "", "", "k", "1")
	f.Add("k", strings.Repeat("v", 2000), "", "", "k", "v")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		a := []Entry{{k1, v1}}
		if k2 != "" {
			a = append(a, Entry{k2, v2})
		}
		b := []Entry{{k3, v3}}
		if err := checkDescriptor(0, a); err != nil {
			if !strings.Contains(err.Error(), "invalid request") {
				t.Fatalf("cap error %v does not wrap ErrInvalid", err)
			}
			return
		}
		same := len(a) == len(b)
		for i := 0; same && i < len(a); i++ {
			same = a[i] == b[i]
		}
		ka := Key(Requests, SlidingWindow, time.Second, "d", a)
		kb := Key(Requests, SlidingWindow, time.Second, "d", b)
		if (ka == kb) != same {
			t.Fatalf("entries %q vs %q: keys equal=%v, entries equal=%v", a, b, ka == kb, same)
		}
	})
}
