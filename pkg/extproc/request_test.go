package extproc

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestWithIncludeUsage(t *testing.T) {
	t.Parallel()
	deep := `{"stream":true,"x":` + strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1) + "}"
	tests := []struct {
		name string
		give string
		want string // "" for unchanged
	}{
		{name: "added first", give: `{"model":"m","stream":true}`, want: `{"stream_options":{"include_usage":true},"model":"m","stream":true}`},
		{name: "into stream_options", give: `{"stream":true,"stream_options":{"x":1}}`, want: `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
		{name: "into empty stream_options", give: `{"stream":true,"stream_options":{ }}`, want: `{"stream":true,"stream_options":{"include_usage":true }}`},
		{name: "null stream_options", give: `{"stream":true,"stream_options":null}`, want: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "whitespace kept", give: " {\n \"stream\" : true \n} \n", want: " {\"stream_options\":{\"include_usage\":true},\n \"stream\" : true \n} \n"},
		{name: "last stream key counts", give: `{"stream":false,"stream":true}`, want: `{"stream_options":{"include_usage":true},"stream":false,"stream":true}`},
		{name: "last stream_options counts", give: `{"stream":true,"stream_options":{"include_usage":false},"stream_options":{}}`, want: `{"stream":true,"stream_options":{"include_usage":false},"stream_options":{"include_usage":true}}`},
		{name: "include_usage already true", give: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "include_usage false is the client's choice", give: `{"stream":true,"stream_options":{"include_usage":false}}`},
		{name: "not streaming", give: `{"stream":false}`},
		{name: "stream absent", give: `{"model":"m"}`},
		{name: "stream is a string", give: `{"stream":"true"}`},
		{name: "stream_options not an object", give: `{"stream":true,"stream_options":[]}`},
		{name: "nested stream is not the request's", give: `{"x":{"stream":true}}`},
		{name: "escaped key is another key", give: `{"\u0073tream":true}`},
		{name: "array", give: `[{"stream":true}]`},
		{name: "trailing garbage", give: `{"stream":true} x`},
		{name: "two objects", give: `{"stream":true}{}`},
		{name: "cut", give: `{"stream":true,"messages":[`},
		{name: "bad number", give: `{"stream":true,"n":01}`},
		{name: "bad escape", give: `{"stream":true,"s":"\q"}`},
		{name: "control character", give: "{\"stream\":true,\"s\":\"a\nb\"}"},
		{name: "too deep", give: deep},
		{name: "empty", give: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := withIncludeUsage([]byte(tt.give))
			if tt.want == "" {
				if ok {
					t.Fatalf("changed to %s, want unchanged", got)
				}
				return
			}
			if !ok || string(got) != tt.want {
				t.Fatalf("got %s (%t), want %s", got, ok, tt.want)
			}
			if !json.Valid(got) {
				t.Fatalf("result is not JSON: %s", got)
			}
		})
	}
}

// TestWithIncludeUsageAgreesWithEncodingJSON: every body json.Valid
// rejects is left alone, and every result decodes with include_usage
// true.
func TestWithIncludeUsageAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, give := range []string{
		`{"stream":true,"n":-0.5e+10,"s":"\u00e9\n","a":[true,false,null,{}],"o":{"p":[]}}`,
		`{"stream":true,"n":1.}`, `{"stream":true,"n":-}`, `{"stream":true,"n":1e}`, `{"stream":true,"s":"\u00g0"}`,
		`{"stream":true,}`, `{"stream":true,"a":[1,]}`, `{"stream" true}`, `{"stream":tru}`,
	} {
		got, ok := withIncludeUsage([]byte(give))
		if ok != json.Valid([]byte(give)) {
			t.Errorf("%s: changed = %t, json.Valid = %t", give, ok, !ok)
			continue
		}
		if !ok {
			continue
		}
		var v struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(got, &v); err != nil || !v.StreamOptions.IncludeUsage {
			t.Errorf("%s -> %s: %v, include_usage %t", give, got, err, v.StreamOptions.IncludeUsage)
		}
	}
}
