package extproc

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzUsageReader: any body, cut anywhere, is read without a panic and
// without allocating (the state is fixed, so memory is bounded whatever
// the body), gives the same Usage however it is split, and never an
// absurd one. The seed corpus is in testdata/fuzz/FuzzUsageReader.
func FuzzUsageReader(f *testing.F) {
	for _, name := range []string{"chat_stream.sse", "responses_stream.sse", "chat.json", "responses.json"} {
		f.Add(testdata(f, name), uint16(100), uint16(400), uint8(kindSniff))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut1, cut2 uint16, k uint8) {
		kind := bodyKind(k % 3)
		a, b := min(int(cut1), len(body)), min(int(cut2), len(body))
		if a > b {
			a, b = b, a
		}
		want := readBody(kind, body)
		if diff := cmp.Diff(want, readBody(kind, body[:a], body[a:b], body[b:])); diff != "" {
			t.Fatalf("cut at %d and %d (-whole +cut):\n%s", a, b, diff)
		}
		var bytewise [][]byte
		for i := range body {
			bytewise = append(bytewise, body[i:i+1])
		}
		if diff := cmp.Diff(want, readBody(kind, bytewise...)); diff != "" {
			t.Fatalf("byte by byte (-whole +bytewise):\n%s", diff)
		}
		if want.StreamedChars > uint64(len(body)) {
			t.Fatalf("%d streamed characters in a %d-byte body", want.StreamedChars, len(body))
		}
		if want.Reported {
			if want.Total < want.Input || want.Total < want.Output || want.Total > 2*maxTokens || want.Input > maxTokens || want.Output > maxTokens {
				t.Fatalf("absurd usage %v", want)
			}
		} else if want.Input+want.Output+want.Total != 0 {
			t.Fatalf("counts without a report: %v", want)
		}
		r := newUsageReader(kind)
		if n := testing.AllocsPerRun(1, func() { r.write(body) }); n != 0 {
			t.Fatalf("write allocated %v times", n)
		}
	})
}

// FuzzWithIncludeUsage: any request body is either left alone or turned
// into valid JSON with include_usage true; only valid JSON is changed.
func FuzzWithIncludeUsage(f *testing.F) {
	f.Add([]byte(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"stream":true,"stream_options":{"x":[1,2,{"y":null}]}}`))
	f.Add([]byte(`{"stream":true,"stream_options":null}`))
	f.Add([]byte(`{"stream":true,"n":-1.5e-3,"s":"\u00e9\\"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := withIncludeUsage(body)
		if !ok {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("changed a body that is not JSON: %q", body)
		}
		// Only an insertion (or null replaced), and the result is JSON.
		// Which key is "stream_options" is not checked with
		// encoding/json: it matches keys without case and decodes
		// escapes, where withIncludeUsage compares keys as written.
		switch len(got) - len(body) {
		case len(addStreamOptions), len(addIncludeUsage), len(addIncludeUsage) + 1, len(replaceNull) - len("null"):
		default:
			t.Fatalf("%q -> %q: not one insertion", body, got)
		}
		if !json.Valid(got) || !bytes.Contains(got, []byte(addIncludeUsage)) {
			t.Fatalf("%q -> %q: not JSON with include_usage", body, got)
		}
	})
}
