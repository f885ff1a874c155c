package server

import (
	"errors"
	"fmt"

	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tollgate-dev/tollgate/pkg/utf8esc"
)

// utf8Codec is the gRPC port's codec: grpc-go's proto codec, except that a
// request that fails to unmarshal only because a string holds invalid
// UTF-8 is repaired (see RepairUTF8) and unmarshalled again. Envoy is C++
// and forwards header and descriptor values as bytes; refusing the whole
// message would hand the decision to Envoy's failure_mode_allow, and for
// an access-log batch lose every settlement in it.
type utf8Codec struct {
	base     encoding.CodecV2
	messages *prometheus.CounterVec // repaired messages by type
	values   *prometheus.CounterVec // repaired string values by message type
}

var _ encoding.CodecV2 = (*utf8Codec)(nil)

func newUTF8Codec() *utf8Codec {
	return &utf8Codec{
		base: encoding.GetCodecV2(protocodec.Name),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_grpc_invalid_utf8_messages_total",
			Help: "Requests on the gRPC port whose strings held invalid UTF-8 and were escaped, by message type.",
		}, []string{"message"}),
		values: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_grpc_invalid_utf8_values_total",
			Help: "String values holding invalid UTF-8 escaped in requests on the gRPC port, by message type.",
		}, []string{"message"}),
	}
}

func (c *utf8Codec) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	for _, m := range []prometheus.Collector{c.messages, c.values} {
		if err := r.Register(m); err != nil {
			return fmt.Errorf("server: register utf8 metrics: %w", err)
		}
	}
	return nil
}

// Name is grpc-go's proto codec's, so content types and peers see no
// difference.
func (c *utf8Codec) Name() string { return protocodec.Name }

// Marshal is grpc-go's: replies are built from repaired requests.
func (c *utf8Codec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

// Unmarshal is grpc-go's, but repairs a message that is refused only for
// invalid UTF-8.
func (c *utf8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	raw := buf.ReadOnlyData()
	err := proto.Unmarshal(raw, m)
	if err == nil || !invalidUTF8(err) {
		return err
	}
	fixed, n, rerr := RepairUTF8(raw, m.ProtoReflect().Descriptor())
	if rerr != nil || n == 0 {
		return err
	}
	if err := proto.Unmarshal(fixed, m); err != nil {
		return fmt.Errorf("unmarshal repaired %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	name := string(m.ProtoReflect().Descriptor().FullName())
	c.messages.WithLabelValues(name).Inc()
	c.values.WithLabelValues(name).Add(float64(n))
	return nil
}

func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// invalidUTF8 says whether err is protobuf-go's invalid UTF-8 error, which
// it marks with an InvalidUTF8 method rather than an exported value.
func invalidUTF8(err error) bool {
	var u interface{ InvalidUTF8() bool }
	return errors.As(err, &u) && u.InvalidUTF8()
}

// repairMaxDepth bounds the nesting RepairUTF8 follows, as proto.Unmarshal
// bounds its own (protowire.DefaultRecursionLimit).
const repairMaxDepth = protowire.DefaultRecursionLimit

// errRepair is RepairUTF8's answer to bytes it cannot walk; the caller
// then keeps the unmarshal error it already has.
var errRepair = errors.New("repair utf8: malformed message")

// RepairUTF8 returns the wire-format message b, of type md, with every
// string field that proto3 validates escaped by utf8esc.String, and how
// many values it escaped. It follows message fields (maps and repeated
// ones included) by the descriptor and copies every other field, unknown
// ones too, byte for byte. Valid strings are left alone, so a message
// that unmarshals as it is repairs to itself. A string with a bytes twin
// (see bytesTwin) moves there instead of being escaped. Bytes inside
// google.protobuf.Any values are not followed: their type is known only
// to whoever unpacks them.
func RepairUTF8(b []byte, md protoreflect.MessageDescriptor) ([]byte, int, error) {
	// Two passes, as proto.Marshal does: the first learns every nested
	// message's new length, so the second writes each byte once. Repairing
	// children into scratch slices instead would copy a message once per
	// level it is nested in, which a deep message makes quadratic.
	var w repairWalk
	size, err := w.size(b, md, 0)
	if err != nil {
		return nil, 0, err
	}
	out := w.write(make([]byte, 0, size), b, md)
	return out, w.values, nil
}

// repairWalk carries RepairUTF8's state between its passes.
type repairWalk struct {
	sizes  []int // new length of each nested message, in pre-order
	next   int   // write's position in sizes
	values int   // strings escaped
	scans  int   // messages scanned for a bytes twin
}

// field is one field of a message on the wire, as both passes see it.
type field struct {
	num   protowire.Number
	typ   protowire.Type
	n     int // length of tag and value
	value []byte
	kind  protoreflect.Kind // StringKind or MessageKind for fields the walk changes, else 0
	fd    protoreflect.FieldDescriptor
}

// bytesTwin returns the bytes field that carries, byte for byte, what
// string field fd would hold if it were not valid UTF-8, or nil. Where the
// two exist, escaping would change what Tollgate reads from what the
// backend reads: ext_authz's body is a JSON document whose invalid bytes a
// backend reads as U+FFFD (encoding/json does), as the body parser does
// for raw_body, so a body that is not UTF-8 moves to raw_body as it is,
// which Envoy itself sends when pack_as_bytes is set. Fields are matched
// by name, as the server imports no API's protos.
func bytesTwin(fd protoreflect.FieldDescriptor) protoreflect.FieldDescriptor {
	var twin protoreflect.Name
	switch fd.FullName() {
	case "envoy.service.auth.v3.AttributeContext.HttpRequest.body":
		twin = "raw_body"
	default:
		return nil
	}
	t := fd.ContainingMessage().Fields().ByName(twin)
	if t == nil || t.Kind() != protoreflect.BytesKind || t.Cardinality() == protoreflect.Repeated {
		return nil
	}
	return t
}

// twinScan answers, for one message, whether an invalid string goes to
// its bytes twin: only when the message does not carry that twin already,
// which then wins. It scans the message at most once per twin, however
// many times the string field repeats on the wire, so a message that
// repeats it cannot make the walk quadratic.
type twinScan struct {
	msg     []byte
	scanned protowire.Number // the twin the last scan looked for (0: none yet)
	present bool
	scans   *int // counts scans, for the walk's tests
}

func (t *twinScan) target(f field) (protoreflect.FieldDescriptor, bool) {
	twin := bytesTwin(f.fd)
	if twin == nil {
		return nil, false
	}
	if t.scanned != twin.Number() {
		t.scanned, t.present = twin.Number(), false
		*t.scans++
		for b := t.msg; len(b) > 0; {
			num, typ, tn := protowire.ConsumeTag(b)
			if tn < 0 {
				break
			}
			vn := protowire.ConsumeFieldValue(num, typ, b[tn:])
			if vn < 0 {
				break
			}
			if num == twin.Number() {
				t.present = true
				break
			}
			b = b[tn+vn:]
		}
	}
	return twin, !t.present
}

// nextField reads the first field of b; its kind is 0 for a field
// copied as it is.
func nextField(b []byte, fields protoreflect.FieldDescriptors) (field, error) {
	num, typ, tn := protowire.ConsumeTag(b)
	if tn < 0 {
		return field{}, errRepair
	}
	f := field{num: num, typ: typ}
	if typ == protowire.BytesType {
		if fd := fields.ByNumber(num); fd != nil {
			switch {
			case fd.Kind() == protoreflect.StringKind && enforceUTF8(fd), fd.Kind() == protoreflect.MessageKind:
				f.kind, f.fd = fd.Kind(), fd
			}
		}
	}
	if f.kind != 0 {
		v, vn := protowire.ConsumeBytes(b[tn:])
		if vn < 0 {
			return field{}, errRepair
		}
		f.value, f.n = v, tn+vn
		return f, nil
	}
	vn := protowire.ConsumeFieldValue(num, typ, b[tn:])
	if vn < 0 {
		return field{}, errRepair
	}
	f.n = tn + vn
	return f, nil
}

// size returns the repaired length of message b and records the lengths
// of the messages nested in it.
func (w *repairWalk) size(b []byte, md protoreflect.MessageDescriptor, depth int) (int, error) {
	if depth > repairMaxDepth {
		return 0, errRepair
	}
	fields := md.Fields()
	total := 0
	twins := twinScan{msg: b, scans: &w.scans}
	for len(b) > 0 {
		f, err := nextField(b, fields)
		if err != nil {
			return 0, err
		}
		switch f.kind {
		case protoreflect.StringKind:
			if utf8.Valid(f.value) {
				total += f.n // write copies it as it came
				break
			}
			w.values++
			if twin, ok := twins.target(f); ok {
				total += protowire.SizeTag(twin.Number()) + protowire.SizeBytes(len(f.value))
			} else {
				total += protowire.SizeTag(f.num) + protowire.SizeBytes(len(utf8esc.Bytes(f.value)))
			}
		case protoreflect.MessageKind:
			i := len(w.sizes)
			w.sizes = append(w.sizes, 0)
			l, err := w.size(f.value, f.fd.Message(), depth+1)
			if err != nil {
				return 0, err
			}
			w.sizes[i] = l
			total += protowire.SizeTag(f.num) + protowire.SizeBytes(l)
		default:
			total += f.n
		}
		b = b[f.n:]
	}
	return total, nil
}

// write appends message b repaired to out; size has walked it already, so
// it cannot fail.
func (w *repairWalk) write(out, b []byte, md protoreflect.MessageDescriptor) []byte {
	fields := md.Fields()
	twins := twinScan{msg: b, scans: &w.scans}
	for len(b) > 0 {
		f, _ := nextField(b, fields)
		switch f.kind {
		case protoreflect.StringKind:
			if utf8.Valid(f.value) {
				out = append(out, b[:f.n]...)
			} else if twin, ok := twins.target(f); ok {
				out = protowire.AppendTag(out, twin.Number(), protowire.BytesType)
				out = protowire.AppendBytes(out, f.value)
			} else {
				out = protowire.AppendTag(out, f.num, f.typ)
				out = protowire.AppendBytes(out, utf8esc.Bytes(f.value))
			}
		case protoreflect.MessageKind:
			out = protowire.AppendTag(out, f.num, f.typ)
			out = protowire.AppendVarint(out, uint64(w.sizes[w.next]))
			w.next++
			out = w.write(out, f.value, f.fd.Message())
		default:
			out = append(out, b[:f.n]...)
		}
		b = b[f.n:]
	}
	return out
}

// enforceUTF8 is protobuf-go's rule for which strings it validates: every
// proto3 string, and in editions those whose utf8_validation is VERIFY.
func enforceUTF8(fd protoreflect.FieldDescriptor) bool {
	if fd.ParentFile() != nil && fd.ParentFile().Syntax() == protoreflect.Editions {
		if e, ok := fd.(interface{ EnforceUTF8() bool }); ok {
			return e.EnforceUTF8()
		}
	}
	return fd.Syntax() == protoreflect.Proto3
}
