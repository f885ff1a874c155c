package utf8esc

import (
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "empty", give: "", want: ""},
		{name: "ascii", give: "gpt-4o", want: "gpt-4o"},
		{name: "valid multibyte kept", give: "modèle-\uFFFD", want: "modèle-\uFFFD"},
		{name: "valid private use kept", give: "a\uEF80", want: "a\uEF80"},
		{name: "lone 0xff", give: "a\xffb", want: "a\uEFFFb"},
		{name: "lone 0x80", give: "\x80", want: "\uEF80"},
		{name: "truncated sequence", give: "\xe2\x82", want: "\uEFE2\uEF82"},
		{name: "surrogate", give: "\xed\xa0\x80", want: "\uEFED\uEFA0\uEF80"},
		{name: "overlong slash", give: "\xc0\xaf", want: "\uEFC0\uEFAF"},
		{name: "private use escaped in an invalid string", give: "\uEF80\xff", want: "\uEFEE\uEFBE\uEF80\uEFFF"},
		{name: "json stays json", give: "{\"model\":\"g\xff\"}", want: `{"model":"g` + "\uEFFF" + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := String(tt.give); got != tt.want {
				t.Errorf("String(%q) = %q, want %q", tt.give, got, tt.want)
			}
			if got := string(Bytes([]byte(tt.give))); got != tt.want {
				t.Errorf("Bytes(%q) = %q, want %q", tt.give, got, tt.want)
			}
		})
	}
}

// TestStringDistinct shows the collision a plain escape would have: the
// invalid byte 0xff and the private use code point standing for it, each
// beside an invalid byte, stay two keys.
func TestStringDistinct(t *testing.T) {
	t.Parallel()
	a, b := String("\xfe\xff"), String("\xfe\uEFFF")
	if a == b {
		t.Fatalf("String(\"\\xfe\\xff\") = String(\"\\xfe\\uEFFF\") = %q", a)
	}
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"", "a", "\xff", "\uEF80\xff", "\xe2\x82", "\xed\xa0\x80", "ok\uFFFD", "\xf4\x90\x80\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := String(s)
		if !utf8.ValidString(got) {
			t.Fatalf("String(%q) = %q, not valid UTF-8", s, got)
		}
		if utf8.ValidString(s) {
			if got != s {
				t.Fatalf("String(%q) = %q, changed a valid string", s, got)
			}
			return
		}
		// Unescape recovering s is what makes String injective on
		// invalid strings.
		if back := Unescape(got); back != s {
			t.Fatalf("Unescape(String(%q)) = %q", s, back)
		}
	})
}
