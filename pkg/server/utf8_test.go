package server

import (
	"bytes"
	"errors"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	datav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"
)

// wire marshals m, then puts each swap's second string where its first
// stood: proto.Marshal refuses to write invalid UTF-8, Envoy sends it.
func wire(t testing.TB, m proto.Message, swaps ...string) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(swaps); i += 2 {
		if len(swaps[i]) != len(swaps[i+1]) || !bytes.Contains(b, []byte(swaps[i])) {
			t.Fatalf("placeholder %q: not in the message or not as long as %q", swaps[i], swaps[i+1])
		}
		b = bytes.ReplaceAll(b, []byte(swaps[i]), []byte(swaps[i+1]))
	}
	return b
}

func checkWithBody(body string, raw []byte, headers map[string]string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Headers: headers, Body: body, RawBody: raw},
	}}}
}

func TestRepairUTF8(t *testing.T) {
	t.Parallel()
	descriptor := func(v string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*commonrl.RateLimitDescriptor{{
			Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: v}},
		}}}
	}
	logEntry := func(v string) *datav3.HTTPAccessLogEntry {
		return &datav3.HTTPAccessLogEntry{CommonProperties: &datav3.AccessLogCommon{Metadata: &corev3.Metadata{
			FilterMetadata: map[string]*structpb.Struct{"ns": {Fields: map[string]*structpb.Value{"k": structpb.NewStringValue(v)}}},
		}}}
	}
	tests := []struct {
		name       string
		give       []byte
		into       proto.Message // the type give is
		want       proto.Message
		wantValues int
	}{
		{
			name: "valid message unchanged", give: wire(t, descriptor("u-1")), into: &rlsv3.RateLimitRequest{},
			want: descriptor("u-1"),
		},
		{
			name: "descriptor value escaped", give: wire(t, descriptor("u~~"), "u~~", "u\xff\xfe"), into: &rlsv3.RateLimitRequest{},
			want: descriptor("u\uEFFF\uEFFE"), wantValues: 1,
		},
		{
			name: "map key and value escaped", give: wire(t, checkWithBody("", nil, map[string]string{"k~": "v~"}), "k~", "k\x80", "v~", "v\xc0"),
			into: &authv3.CheckRequest{}, want: checkWithBody("", nil, map[string]string{"k\uEF80": "v\uEFC0"}), wantValues: 2,
		},
		{
			name: "body moves to raw_body as it came", give: wire(t, checkWithBody(`{"model":"~~"}`, nil, nil), "~~", "\xff\xff"),
			into: &authv3.CheckRequest{}, want: checkWithBody("", []byte("{\"model\":\"\xff\xff\"}"), nil), wantValues: 1,
		},
		{
			name: "body escaped where raw_body is sent too", give: wire(t, checkWithBody("b~", []byte("raw"), nil), "b~", "b\xff"),
			into: &authv3.CheckRequest{}, want: checkWithBody("b\uEFFF", []byte("raw"), nil), wantValues: 1,
		},
		{
			name: "string in a Struct in a map escaped", give: wire(t, logEntry("x~~"), "x~~", "x\xed\xa0"),
			into: &datav3.HTTPAccessLogEntry{}, want: logEntry("x\uEFED\uEFA0"), wantValues: 1,
		},
		{
			// Unknown fields are not validated, so they are kept as they came.
			name: "unknown field kept", give: protowire.AppendBytes(protowire.AppendTag(wire(t, descriptor("u~"), "u~", "u\xff"), 999, protowire.BytesType), []byte{0xff}),
			into: &rlsv3.RateLimitRequest{}, want: func() proto.Message {
				m := descriptor("u\uEFFF")
				m.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 999, protowire.BytesType), []byte{0xff}))
				return m
			}(), wantValues: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, n, err := RepairUTF8(tt.give, tt.into.ProtoReflect().Descriptor())
			if err != nil {
				t.Fatalf("RepairUTF8: %v", err)
			}
			if n != tt.wantValues {
				t.Errorf("RepairUTF8 escaped %d values, want %d", n, tt.wantValues)
			}
			got := tt.into.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(out, got); err != nil {
				t.Fatalf("unmarshal repaired: %v", err)
			}
			if d := cmp.Diff(tt.want, got, protocmp.Transform()); d != "" {
				t.Errorf("repaired message (-want +got):\n%s", d)
			}
		})
	}
}

func TestRepairUTF8Malformed(t *testing.T) {
	t.Parallel()
	good := wire(t, &rlsv3.RateLimitRequest{Domain: "d~"}, "d~", "d\xff")
	// A chain of Structs: Struct.fields (1) -> map entry's value (2) ->
	// Value.struct_value (5) -> Struct ..., three messages a link.
	chain := func(links int) []byte {
		var b []byte
		for range links {
			b = protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), b)
			b = protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), b)
			b = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), b)
		}
		return b
	}
	deep := chain(repairMaxDepth/3 + 1)
	if _, _, err := RepairUTF8(chain(repairMaxDepth/3-1), (&structpb.Struct{}).ProtoReflect().Descriptor()); err != nil {
		t.Fatalf("RepairUTF8 of a chain within the limit: %v", err)
	}
	tests := []struct {
		name string
		give []byte
		into proto.Message
	}{
		{name: "truncated length", give: good[:len(good)-1], into: &rlsv3.RateLimitRequest{}},
		{name: "bad tag", give: []byte{0x80}, into: &rlsv3.RateLimitRequest{}},
		{name: "deeper than the limit", give: deep, into: &structpb.Struct{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, _, err := RepairUTF8(tt.give, tt.into.ProtoReflect().Descriptor()); !errors.Is(err, errRepair) {
				t.Errorf("RepairUTF8 = %v, want errRepair", err)
			}
		})
	}
}

// TestRepairUTF8RepeatedBody: a body field repeated on the wire (the
// last one wins) has the message scanned for raw_body once per pass, not
// once per repeat, which would make a 4 MiB message quadratic.
func TestRepairUTF8RepeatedBody(t *testing.T) {
	t.Parallel()
	md := (&authv3.AttributeContext_HttpRequest{}).ProtoReflect().Descriptor()
	body := md.Fields().ByName("body").Number()
	tests := []struct {
		name    string
		give    int // times the body repeats
		raw     bool
		want    int // scans
		wantRaw string
	}{
		{name: "once", give: 1, want: 2, wantRaw: "b\xff"},
		{name: "ten thousand times", give: 10000, want: 2, wantRaw: "b\xff"},
		{name: "with raw_body", give: 10000, raw: true, want: 2, wantRaw: "raw"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b []byte
			if tt.raw {
				b = protowire.AppendBytes(protowire.AppendTag(b, md.Fields().ByName("raw_body").Number(), protowire.BytesType), []byte("raw"))
			}
			for range tt.give {
				b = protowire.AppendBytes(protowire.AppendTag(b, body, protowire.BytesType), []byte("b\xff"))
			}
			var w repairWalk
			size, err := w.size(b, md, 0)
			if err != nil {
				t.Fatal(err)
			}
			out := w.write(make([]byte, 0, size), b, md)
			if w.scans != tt.want {
				t.Errorf("scanned %d times, want %d", w.scans, tt.want)
			}
			got := &authv3.AttributeContext_HttpRequest{}
			if err := proto.Unmarshal(out, got); err != nil {
				t.Fatal(err)
			}
			if string(got.GetRawBody()) != tt.wantRaw {
				t.Errorf("raw_body = %q, want %q", got.GetRawBody(), tt.wantRaw)
			}
		})
	}
}

// TestUTF8CodecUnmarshal: the codec repairs only an invalid UTF-8 error,
// keeps any other, and counts what it repaired.
func TestUTF8CodecUnmarshal(t *testing.T) {
	t.Parallel()
	bad := wire(t, &rlsv3.RateLimitRequest{Domain: "d~"}, "d~", "d\xff")
	tests := []struct {
		name    string
		give    []byte
		want    *rlsv3.RateLimitRequest
		wantErr bool
		wantN   float64
	}{
		{name: "valid", give: wire(t, &rlsv3.RateLimitRequest{Domain: "ai"}), want: &rlsv3.RateLimitRequest{Domain: "ai"}},
		{name: "invalid utf8 repaired", give: bad, want: &rlsv3.RateLimitRequest{Domain: "d\uEFFF"}, wantN: 1},
		{name: "truncated refused", give: bad[:len(bad)-1], wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newUTF8Codec()
			got := &rlsv3.RateLimitRequest{}
			err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tt.give)}, got)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Unmarshal = %v, want error %t", err, tt.wantErr)
			}
			if !tt.wantErr {
				if d := cmp.Diff(tt.want, got, protocmp.Transform()); d != "" {
					t.Errorf("Unmarshal (-want +got):\n%s", d)
				}
			}
			var m dto.Metric
			if err := c.messages.WithLabelValues("envoy.service.ratelimit.v3.RateLimitRequest").Write(&m); err != nil {
				t.Fatal(err)
			}
			if n := m.GetCounter().GetValue(); n != tt.wantN {
				t.Errorf("repaired messages = %v, want %v", n, tt.wantN)
			}
		})
	}
}

// FuzzRepairUTF8 holds RepairUTF8 to its promises on any bytes read as
// the richest request Envoy sends: a message that unmarshals repairs to
// the same message, a repaired one never fails on UTF-8, and repairing
// twice changes nothing more.
func FuzzRepairUTF8(f *testing.F) {
	f.Add(wire(f, checkWithBody(`{"model":"~~"}`, nil, map[string]string{"k~": "v"}), "~~", "\xff\xfe", "k~", "k\xc0"))
	f.Add(wire(f, checkWithBody("b~", []byte("raw"), nil), "b~", "b\xff"))
	f.Add(wire(f, checkWithBody("ok", nil, map[string]string{"a": "b"})))
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})
	f.Fuzz(func(t *testing.T, b []byte) {
		md := (&authv3.CheckRequest{}).ProtoReflect().Descriptor()
		orig := &authv3.CheckRequest{}
		origErr := proto.Unmarshal(b, orig)
		out, n, err := RepairUTF8(b, md)
		if err != nil {
			if origErr == nil {
				t.Fatalf("RepairUTF8 refused a message that unmarshals: %v", err)
			}
			return
		}
		got := &authv3.CheckRequest{}
		gotErr := proto.Unmarshal(out, got)
		if gotErr != nil && invalidUTF8(gotErr) {
			t.Fatalf("repaired message still fails on UTF-8: %v", gotErr)
		}
		if origErr == nil {
			if n != 0 {
				t.Fatalf("RepairUTF8 escaped %d values of a valid message", n)
			}
			if !proto.Equal(orig, got) {
				t.Fatalf("RepairUTF8 changed a valid message:\n%v\n%v", orig, got)
			}
		}
		if _, n2, err := RepairUTF8(out, md); err != nil || n2 != 0 {
			t.Fatalf("second repair: %d values, %v", n2, err)
		}
	})
}

// BenchmarkUTF8Codec compares the codec with grpc-go's on a valid Check
// (the hot path: it must cost nothing more) and shows what a repair costs.
func BenchmarkUTF8Codec(b *testing.B) {
	hs := map[string]string{"authorization": "Bearer sk-0123456789abcdef", "content-type": "application/json", "x-user": "u~~", "user-agent": "bench"}
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}`
	valid := wire(b, checkWithBody(body, nil, hs))
	bad := wire(b, checkWithBody(body, nil, hs), "u~~", "u\xff\xfe")
	ours := newUTF8Codec()
	for _, bb := range []struct {
		name  string
		codec interface {
			Unmarshal(mem.BufferSlice, any) error
		}
		give []byte
	}{
		{name: "grpc/valid", codec: ours.base, give: valid},
		{name: "utf8/valid", codec: ours, give: valid},
		{name: "utf8/repaired", codec: ours, give: bad},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bb.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bb.give)}, &authv3.CheckRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
