// Package istio checks the Istio manifests in istio/ offline, with no
// cluster and no istioctl.
//
// It is its own Go module so that Istio's and Kubernetes' dependencies
// never enter the main module's build: `go test ./...` at the root does not
// see it. Run it with `cd test/istio && go test ./...`.
//
// Each Kubernetes object is decoded strictly: the envelope (apiVersion,
// kind, metadata) into istio.io/client-go's typed object, and the spec with
// protojson into istio.io/api's message, where an unknown field is an error.
// client-go's own JSON decoding of a spec is not used because it is lenient:
// istio.io/api's generated UnmarshalJSON sets AllowUnknownFields, so a
// misspelt field would vanish silently. mesh-config.yaml is decoded the same
// way into MeshConfig.
//
// Each EnvoyFilter patch value is then decoded by its applyTo into the
// go-control-plane type Istio would patch (HTTP_FILTER -> HttpFilter,
// VIRTUAL_HOST -> VirtualHost, ...), strictly, every Any and TypedStruct is
// unpacked, and the protoc-gen-validate rules run on every message (see
// deepValidate). Last come the cross-references PGV cannot see (lint_test.go).
package istio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	// Types used only through "@type": importing a package registers its
	// messages in protoregistry.GlobalTypes, which protojson and anypb
	// resolve against. A manifest that uses a type not imported here fails
	// as an unknown @type; add its package to this list.
	_ "github.com/cncf/xds/go/udpa/type/v1" // udpa.type.v1.TypedStruct
	_ "github.com/cncf/xds/go/xds/type/v3"  // xds.type.v3.TypedStruct

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"           // ExternalProcessor
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3" // Config
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"          // RateLimit, RateLimitPerRoute
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"             // Router
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"                  // HttpProtocolOptions
)

// ---------------------------------------------------------------------------
// Kubernetes objects

// resource is one object of a manifest file, decoded strictly.
type resource struct {
	file string         // base name, e.g. ratelimit.yaml
	line int            // line of the document's first line in file
	doc  []byte         // the document, to find the line of a field
	obj  runtime.Object // *EnvoyFilter, *AuthorizationPolicy or *Telemetry
}

func (r resource) meta() metav1.Object { return r.obj.(metav1.Object) }

// String names r in problems: file, kind, namespace/name.
func (r resource) String() string { return r.at(0) }

// at is String with the line moved down by the 0-based line within the
// document.
func (r resource) at(line int) string {
	return fmt.Sprintf("%s:%d: %s %s/%s", r.file, r.line+line, r.obj.GetObjectKind().GroupVersionKind().Kind, r.meta().GetNamespace(), r.meta().GetName())
}

// newScheme knows the Istio kinds the manifests may hold. Built per call:
// no package-level mutable state.
func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{networkingv1alpha3.AddToScheme, securityv1.AddToScheme, telemetryv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// documentSep splits a YAML stream into documents.
var documentSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// documents returns the non-empty YAML documents of data with the line
// each starts on.
func documents(data []byte) (docs [][]byte, lines []int) {
	line := 1
	for _, part := range documentSep.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(part)) != "" {
			docs = append(docs, []byte(part))
			lines = append(lines, line)
		}
		line += strings.Count(part, "\n")
	}
	return docs, lines
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// decodeResources decodes every document of file strictly.
func decodeResources(file string, data []byte) ([]resource, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	docs, lines := documents(data)
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s: no YAML document", file)
	}
	var out []resource
	for i, doc := range docs {
		obj, err := decodeObject(scheme, doc)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", file, lines[i]+lineOf(doc, err), err)
		}
		out = append(out, resource{file: file, line: lines[i], doc: doc, obj: obj})
	}
	return out, nil
}

// decodeObject decodes one document: the envelope with a strict JSON
// decode, the spec with strict protojson.
func decodeObject(scheme *runtime.Scheme, doc []byte) (runtime.Object, error) {
	var env struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
		Spec            json.RawMessage   `json:"spec"`
	}
	// UnmarshalStrict: unknown keys (a "specs:" or a misspelt metadata
	// field) and duplicate keys are errors.
	if err := yaml.UnmarshalStrict(doc, &env); err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	gvk := env.GroupVersionKind()
	obj, err := scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("apiVersion %q kind %q: %w", env.APIVersion, env.Kind, err)
	}
	if env.Metadata.Name == "" || env.Metadata.Namespace == "" {
		return nil, fmt.Errorf("%s: metadata.name and metadata.namespace are required (a selector only selects pods of its own namespace)", gvk.Kind)
	}
	if len(bytes.TrimSpace(env.Spec)) == 0 {
		return nil, fmt.Errorf("%s %s: no spec", gvk.Kind, env.Metadata.Name)
	}
	v := reflect.ValueOf(obj).Elem()
	v.FieldByName("ObjectMeta").Set(reflect.ValueOf(env.Metadata))
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	spec, ok := v.FieldByName("Spec").Addr().Interface().(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%s: spec is not a proto message", gvk.Kind)
	}
	// The zero options are the strict ones: DiscardUnknown is false.
	if err := (protojson.UnmarshalOptions{}).Unmarshal(env.Spec, spec); err != nil {
		return nil, fmt.Errorf("%s %s/%s: spec as %s: %w", gvk.Kind, env.Metadata.Namespace, env.Metadata.Name, spec.ProtoReflect().Descriptor().FullName(), err)
	}
	return obj, nil
}

// decodeMeshConfig decodes a MeshConfig YAML strictly.
func decodeMeshConfig(file string, data []byte) (*meshv1alpha1.MeshConfig, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	mc := &meshv1alpha1.MeshConfig{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, mc); err != nil {
		err = fmt.Errorf("MeshConfig: %w", err)
		return nil, fmt.Errorf("%s:%d: %w", file, 1+lineOf(data, err), err)
	}
	return mc, nil
}

// unknownField finds the field name in protojson's and encoding/json's
// unknown-field errors.
var unknownField = regexp.MustCompile(`unknown field "([^"]+)"`)

// lineOf returns the 0-based line in doc of the field an unknown-field
// error names, or 0: protojson reports positions in the JSON made from the
// YAML, which mean nothing to the reader of the YAML.
func lineOf(doc []byte, err error) int {
	m := unknownField.FindStringSubmatch(err.Error())
	if m == nil {
		return 0
	}
	re := regexp.MustCompile(`(?m)^[ \t-]*"?` + regexp.QuoteMeta(m[1]) + `"?[ \t]*:`)
	loc := re.FindIndex(doc)
	if loc == nil {
		return 0
	}
	return bytes.Count(doc[:loc[0]], []byte("\n"))
}

// ---------------------------------------------------------------------------
// EnvoyFilter patch values

// patchType is what Istio decodes a patch value into, by applyTo
// (istio/pkg/config/validation: the same mapping istioctl validate uses).
func patchType(a networkingapi.EnvoyFilter_ApplyTo) (proto.Message, bool) {
	switch a {
	case networkingapi.EnvoyFilter_LISTENER:
		return &listenerv3.Listener{}, true
	case networkingapi.EnvoyFilter_FILTER_CHAIN:
		return &listenerv3.FilterChain{}, true
	case networkingapi.EnvoyFilter_NETWORK_FILTER:
		return &listenerv3.Filter{}, true
	case networkingapi.EnvoyFilter_HTTP_FILTER:
		return &hcmv3.HttpFilter{}, true
	case networkingapi.EnvoyFilter_ROUTE_CONFIGURATION:
		return &routev3.RouteConfiguration{}, true
	case networkingapi.EnvoyFilter_VIRTUAL_HOST:
		return &routev3.VirtualHost{}, true
	case networkingapi.EnvoyFilter_HTTP_ROUTE:
		return &routev3.Route{}, true
	case networkingapi.EnvoyFilter_CLUSTER:
		return &clusterv3.Cluster{}, true
	case networkingapi.EnvoyFilter_EXTENSION_CONFIG:
		return &corev3.TypedExtensionConfig{}, true
	case networkingapi.EnvoyFilter_BOOTSTRAP:
		return &bootstrapv3.Bootstrap{}, true
	case networkingapi.EnvoyFilter_LISTENER_FILTER:
		return &listenerv3.ListenerFilter{}, true
	}
	return nil, false
}

// envoyPatch is one configPatches entry with its value decoded.
type envoyPatch struct {
	path  string // e.g. ratelimit.yaml:33: EnvoyFilter inference/x: configPatches[1] (HTTP_FILTER INSERT_BEFORE)
	cp    *networkingapi.EnvoyFilter_EnvoyConfigObjectPatch
	value proto.Message // nil for REMOVE
}

// decodePatches decodes every patch value of ef strictly into its
// go-control-plane type.
func decodePatches(r resource, ef *networkingapi.EnvoyFilter) ([]envoyPatch, []string) {
	var out []envoyPatch
	var problems []string
	for i, cp := range ef.GetConfigPatches() {
		patch := fmt.Sprintf("configPatches[%d] (%v %v)", i, cp.GetApplyTo(), cp.GetPatch().GetOperation())
		path := r.String() + ": " + patch
		op := cp.GetPatch().GetOperation()
		if op == networkingapi.EnvoyFilter_Patch_INVALID {
			problems = append(problems, path+": patch.operation is not set")
			continue
		}
		if op == networkingapi.EnvoyFilter_Patch_REMOVE {
			if len(cp.GetPatch().GetValue().GetFields()) > 0 {
				problems = append(problems, path+": a REMOVE patch takes no value")
			}
			out = append(out, envoyPatch{path: path, cp: cp})
			continue
		}
		m, ok := patchType(cp.GetApplyTo())
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: applyTo %v: no Envoy type known for it", path, cp.GetApplyTo()))
			continue
		}
		js, err := protojson.Marshal(cp.GetPatch().GetValue())
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: value: %v", path, err))
			continue
		}
		if err := (protojson.UnmarshalOptions{}).Unmarshal(js, m); err != nil {
			// The line of the misspelt field, when the error names one.
			problems = append(problems, fmt.Sprintf("%s: %s: value as %s: %v", r.at(lineOf(r.doc, err)), patch, m.ProtoReflect().Descriptor().FullName(), err))
			continue
		}
		out = append(out, envoyPatch{path: path, cp: cp, value: m})
	}
	return out, problems
}

// whole says whether a patch's value is a complete message. A MERGE value
// is a fragment merged into what Istio generated, so the value's own
// required-field rules (a VirtualHost's name and domains) would misfire;
// the messages inside its Any fields are still whole (Istio replaces a
// map entry or list element, it does not merge into it).
func whole(op networkingapi.EnvoyFilter_Patch_Operation) bool {
	switch op {
	case networkingapi.EnvoyFilter_Patch_MERGE, networkingapi.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST:
		return false
	}
	return true
}

// ---------------------------------------------------------------------------
// Deep validation (from test/envoyconfig, with the MERGE rule above)

// validator is the PGV-generated method on every go-control-plane message.
type validator interface{ ValidateAll() error }

// multiError is the generated <Message>MultiError.
type multiError interface{ AllErrors() []error }

// fieldError is the generated <Message>ValidationError.
type fieldError interface {
	Reason() string
	Cause() error
}

// deepValidate walks m, unpacking every Any and TypedStruct, and returns
// one problem per line, each prefixed with the path of the message it is
// about. PGV's ValidateAll does not look inside an Any, so a bad filter
// config would pass it. With isWhole false, PGV runs only inside Anys.
func deepValidate(path string, m proto.Message, isWhole bool) []string {
	w := walker{}
	w.message(path, m.ProtoReflect(), isWhole)
	return w.problems
}

type walker struct{ problems []string }

func (w *walker) addf(path, format string, args ...any) {
	w.problems = append(w.problems, path+": "+fmt.Sprintf(format, args...))
}

func (w *walker) message(path string, m protoreflect.Message, isWhole bool) {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Any":
		w.any(path, m.Interface().(*anypb.Any))
		return
	case "google.protobuf.Duration":
		// Envoy rejects a negative or huge Duration anywhere at load time;
		// PGV checks only fields that have duration rules.
		d := m.Interface().(*durationpb.Duration)
		if d.GetSeconds() < 0 || d.GetNanos() < 0 {
			w.addf(path, "negative duration %v", d.AsDuration())
		} else if d.GetSeconds() > 315576000000 {
			w.addf(path, "duration of %d seconds is out of range", d.GetSeconds())
		}
		return
	case "xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct":
		fields := m.Descriptor().Fields()
		typeURL := m.Get(fields.ByName("type_url")).String()
		value, _ := m.Get(fields.ByName("value")).Message().Interface().(*structpb.Struct)
		w.typedStruct(path, typeURL, value)
		return
	}
	if v, ok := m.Interface().(validator); ok && isWhole {
		w.pgv(path, v.ValidateAll())
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				break
			}
			var keys []protoreflect.MapKey
			v.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, k)
				return true
			})
			sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
			for _, k := range keys {
				w.message(fmt.Sprintf("%s[%q]", p, k.String()), v.Map().Get(k).Message(), isWhole)
			}
		case fd.IsList():
			if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
				break
			}
			for i := 0; i < v.List().Len(); i++ {
				w.message(fmt.Sprintf("%s[%d]", p, i), v.List().Get(i).Message(), isWhole)
			}
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			w.message(p, v.Message(), isWhole)
		}
		return true
	})
}

// pgv records err's field errors, leaving out "embedded message failed
// validation": the walk validates that message itself, with a longer path.
func (w *walker) pgv(path string, err error) {
	if err == nil {
		return
	}
	errs := []error{err}
	if me, ok := err.(multiError); ok {
		errs = me.AllErrors()
	}
	for _, e := range errs {
		if fe, ok := e.(fieldError); ok && fe.Cause() != nil && fe.Reason() == "embedded message failed validation" {
			continue
		}
		w.addf(path, "%v", e)
	}
}

func (w *walker) any(path string, a *anypb.Any) {
	inner, err := a.UnmarshalNew() // protoregistry.GlobalTypes; unknown types fail
	if err != nil {
		w.addf(path, "cannot unpack Any %q: %v", a.GetTypeUrl(), err)
		return
	}
	w.message(path+"<"+shortName(inner)+">", inner.ProtoReflect(), true)
}

func (w *walker) typedStruct(path, typeURL string, value *structpb.Struct) {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		w.addf(path, "TypedStruct type_url %q: %v", typeURL, err)
		return
	}
	js, err := protojson.Marshal(value)
	if err != nil {
		w.addf(path, "TypedStruct value: %v", err)
		return
	}
	inner := mt.New().Interface()
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, inner); err != nil {
		w.addf(path, "TypedStruct value as %s: %v", typeURL, err)
		return
	}
	w.message(path+"<"+shortName(inner)+">", inner.ProtoReflect(), true)
}

func shortName(m proto.Message) string {
	return string(m.ProtoReflect().Descriptor().Name())
}
