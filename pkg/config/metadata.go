package config

import (
	"math"
	"strconv"

	"gopkg.in/yaml.v3"
)

// maxMetadataDepth bounds how deep a descriptor's metadata nests: far
// more than a routing hint needs, and a guard for the recursion.
const maxMetadataDepth = 16

// metadata reads a descriptor's metadata (envoyproxy/ratelimit's): a
// mapping of anything YAML holds, returned in the rate limit response's
// dynamic metadata for the descriptors that were not over their limits.
// It is read as protobuf's Struct holds it: keys are the text of
// scalars, numbers are float64, and a scalar of any other type (a
// timestamp, binary) is its text. Empty is nil.
func (w *walker) metadata(n *yaml.Node, path string) map[string]any {
	r := w.resolve(n)
	if r.Kind != yaml.MappingNode {
		w.addf(r, path, "want a mapping, got %s", describe(r))
		return nil
	}
	v, ok := w.metaValue(r, path, 0)
	if !ok {
		return nil
	}
	m := v.(map[string]any)
	if len(m) == 0 {
		return nil
	}
	return m
}

func (w *walker) metaValue(n *yaml.Node, path string, depth int) (any, bool) {
	n = w.resolve(n)
	if w.stopped {
		return nil, false
	}
	if depth > maxMetadataDepth {
		w.addf(n, path, "nested deeper than %d levels", maxMetadataDepth)
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		ok := true
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := w.resolve(n.Content[i])
			if k.Kind != yaml.ScalarNode {
				w.addf(k, path, "a key must be a string, got %s", describe(k))
				ok = false
				continue
			}
			p := join(path, k.Value)
			if _, dup := m[k.Value]; dup {
				w.addf(k, p, "repeated key")
				ok = false
				continue
			}
			v, vok := w.metaValue(n.Content[i+1], p, depth+1)
			ok = ok && vok
			m[k.Value] = v
		}
		return m, ok
	case yaml.SequenceNode:
		l := make([]any, len(n.Content))
		ok := true
		for i, c := range n.Content {
			v, vok := w.metaValue(c, path+"["+strconv.Itoa(i)+"]", depth+1)
			ok = ok && vok
			l[i] = v
		}
		return l, ok
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, true
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err == nil {
				return b, true
			}
		case "!!int":
			var i int64
			if err := n.Decode(&i); err == nil {
				return float64(i), true
			}
			var u uint64
			if err := n.Decode(&u); err == nil {
				return float64(u), true
			}
		case "!!float":
			var f float64
			if err := n.Decode(&f); err == nil {
				if math.IsNaN(f) || math.IsInf(f, 0) {
					// protobuf's JSON form has no place for them.
					w.addf(n, path, "%s is not a number JSON can hold", n.Value)
					return nil, false
				}
				return f, true
			}
		}
		return n.Value, true
	}
	w.addf(n, path, "want a value, got %s", describe(n))
	return nil, false
}
