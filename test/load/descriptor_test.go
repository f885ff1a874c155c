package load

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseDescriptor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    string
		want    Descriptor
		wantErr string
	}{
		{name: "one", give: "tenant=acme", want: Descriptor{{"tenant", "acme"}}},
		{name: "two", give: "tenant=acme,model=gpt-4o", want: Descriptor{{"tenant", "acme"}, {"model", "gpt-4o"}}},
		{name: "equals in value", give: "q=a=b==", want: Descriptor{{"q", "a=b=="}}},
		{name: "escaped comma", give: `path=/a\,b,x=1`, want: Descriptor{{"path", "/a,b"}, {"x", "1"}}},
		{name: "escaped equals in key", give: `a\=b=c`, want: Descriptor{{"a=b", "c"}}},
		{name: "escaped backslash", give: `k=a\\,l=\\\,`, want: Descriptor{{"k", `a\`}, {"l", `\,`}}},
		{name: "empty value", give: "tenant=", want: Descriptor{{"tenant", ""}}},
		{name: "spaces kept", give: " k = v ", want: Descriptor{{" k ", " v "}}},
		{name: "empty", give: "", wantErr: "empty descriptor"},
		{name: "no equals", give: "tenant", wantErr: `entry 1 ("tenant") has no '='`},
		{name: "empty key", give: "=v", wantErr: "entry 1 has an empty key"},
		{name: "empty entry", give: "a=b,,c=d", wantErr: "entry 2 is empty"},
		{name: "trailing comma", give: "a=b,", wantErr: "entry 2 is empty"},
		{name: "bad escape", give: `a=\n`, wantErr: `'\n' is not an escape`},
		{name: "trailing backslash", give: `a=b\`, wantErr: `trailing '\'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseDescriptor(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseDescriptor(%q) error = %v, want %q", tt.give, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDescriptor(%q): %v", tt.give, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseDescriptor(%q) = %q, want %q", tt.give, got, tt.want)
			}
			back, err := ParseDescriptor(got.String())
			if err != nil || !reflect.DeepEqual(back, got) {
				t.Fatalf("round trip through %q = %q, %v", got.String(), back, err)
			}
		})
	}
}

func FuzzParseDescriptor(f *testing.F) {
	for _, s := range []string{"tenant=acme", "tenant=acme,model=gpt-4o", `path=/a\,b,q=x=y`, `a\=b=c`, `k=\\`, "=", ",", `\`, "a=b,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDescriptor(s)
		if err != nil {
			return
		}
		if len(d) == 0 {
			t.Fatalf("ParseDescriptor(%q) accepted no entries", s)
		}
		for _, e := range d {
			if e.Key == "" {
				t.Fatalf("ParseDescriptor(%q) accepted an empty key", s)
			}
		}
		back, err := ParseDescriptor(d.String())
		if err != nil || !reflect.DeepEqual(back, d) {
			t.Fatalf("ParseDescriptor(%q) = %q; its String %q parses to %q, %v", s, d, d.String(), back, err)
		}
	})
}
