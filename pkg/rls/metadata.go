package rls

import (
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// MetadataField is where the response's dynamic metadata carries the
// rules' metadata, as envoyproxy/ratelimit puts it.
const MetadataField = "metadata"

// ruleMetadata merges the metadata of the rules that answered req's
// descriptors without refusing them, in the descriptors' order, the way
// envoyproxy/ratelimit merges it: a key already set stays, and two
// mappings under one key merge the same way, deeper down. A descriptor
// counts as the reference counts it: matched by a rule that limits it (not
// unlimited, not displaced by replaces, and not limited by the request's
// own override, which is a limit without metadata) and not over that
// limit. nil when there is nothing to merge.
func ruleMetadata(req *limit.Request, dec *admission.Decision) map[string]any {
	var out map[string]any
	for i := range dec.Statuses {
		st := &dec.Statuses[i]
		r := st.Rule
		if r == nil || len(r.Metadata) == 0 || st.Code != limit.CodeOK || st.Replaced || r.Unlimited ||
			i >= len(req.Descriptors) || req.Descriptors[i].Override != nil {
			continue
		}
		if out == nil {
			out = make(map[string]any, len(r.Metadata))
		}
		mergeFirstWins(out, r.Metadata)
	}
	return out
}

// mergeFirstWins adds src's keys to dst, keeping dst's value for a key
// both hold unless both values are mappings, which it merges alike. It
// copies the mappings it descends into, so that the rules' own are never
// written.
func mergeFirstWins(dst, src map[string]any) {
	for k, v := range src {
		have, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		hm, hok := have.(map[string]any)
		sm, sok := v.(map[string]any)
		if !hok || !sok {
			continue
		}
		cp := make(map[string]any, len(hm)+len(sm))
		for hk, hv := range hm {
			cp[hk] = hv
		}
		mergeFirstWins(cp, sm)
		dst[k] = cp
	}
}

// addMetadata puts m, when there is one, under MetadataField in the
// response's dynamic metadata s (nil: a new one), and returns s.
func addMetadata(s *structpb.Struct, m map[string]any) *structpb.Struct {
	if len(m) == 0 {
		return s
	}
	v, err := structpb.NewValue(m)
	if err != nil {
		// The loader only builds what a Struct holds (pkg/config's
		// metadata): not reached.
		return s
	}
	if s == nil {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	s.Fields[MetadataField] = v
	return s
}
