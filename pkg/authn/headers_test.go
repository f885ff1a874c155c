package authn

import (
	"strings"
	"testing"
)

func TestKeyFromHeaders(t *testing.T) {
	t.Parallel()
	order := []string{"authorization", "x-api-key"}
	tests := []struct {
		name    string
		give    map[string]string
		headers []string
		want    string
		wantOK  bool
	}{
		{name: "bearer", give: map[string]string{"authorization": "Bearer " + keyAcme}, want: keyAcme, wantOK: true},
		{name: "scheme in any case", give: map[string]string{"authorization": "bEARER " + keyAcme}, want: keyAcme, wantOK: true},
		{name: "spaces and tabs trimmed", give: map[string]string{"authorization": " \tBearer \t " + keyAcme + " \t"}, want: keyAcme, wantOK: true},
		{name: "tab after the scheme", give: map[string]string{"authorization": "Bearer\t" + keyAcme}, want: keyAcme, wantOK: true},
		{name: "bearer wins by order", give: map[string]string{"authorization": "Bearer " + keyAcme, "x-api-key": keyCI}, want: keyAcme, wantOK: true},
		{name: "raw header", give: map[string]string{"x-api-key": " " + keyCI + " "}, want: keyCI, wantOK: true},
		{name: "raw header is not parsed", give: map[string]string{"x-api-key": "Bearer " + keyCI}, want: "Bearer " + keyCI, wantOK: true},
		{name: "another scheme falls through", give: map[string]string{"authorization": "Basic dXNlcjpwYXNz", "x-api-key": keyCI}, want: keyCI, wantOK: true},
		{name: "empty bearer falls through", give: map[string]string{"authorization": "Bearer   ", "x-api-key": keyCI}, want: keyCI, wantOK: true},
		{name: "a scheme without credentials", give: map[string]string{"authorization": "Bearer"}},
		{name: "a scheme glued to the key", give: map[string]string{"authorization": "Bearer" + keyAcme}},
		{name: "no scheme", give: map[string]string{"authorization": keyAcme}},
		{name: "blank raw header", give: map[string]string{"x-api-key": " \t "}},
		{name: "nothing", give: map[string]string{}},
		{name: "no headers asked", give: map[string]string{"authorization": "Bearer " + keyAcme}, headers: []string{}},
		{name: "authorization named in any case", give: map[string]string{"Authorization": "Bearer " + keyAcme}, headers: []string{"Authorization"}, want: keyAcme, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			headers := tt.headers
			if headers == nil {
				headers = order
			}
			got, ok := KeyFromHeaders(func(name string) string { return tt.give[name] }, headers)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("KeyFromHeaders = %q, %t; want %q, %t", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func BenchmarkKeyFromHeaders(b *testing.B) {
	h := map[string]string{"authorization": "Bearer " + keyAcme}
	get := func(name string) string { return h[name] }
	headers := []string{"authorization", "x-api-key"}
	b.ReportAllocs()
	for b.Loop() {
		if k, ok := KeyFromHeaders(get, headers); !ok || !strings.HasPrefix(k, "sk-") {
			b.Fatal(k)
		}
	}
}
