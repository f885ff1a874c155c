package envoysim

import (
	"net/http"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// field is one header as Envoy's header map holds it: a lower-case key
// (Envoy lower-cases every key it receives), duplicates kept apart.
type field struct{ k, v string }

// headers is an ordered header map, pseudo-headers first, as Envoy keeps
// them; a few dozen entries, so a slice beats a map.
type headers []field

func (h headers) get(k string) (string, bool) {
	for _, f := range h {
		if f.k == k {
			return f.v, true
		}
	}
	return "", false
}

// joined is k's values merged with "," (how CheckRequest headers and
// descriptor values see duplicates).
func (h headers) joined(k string) (string, bool) {
	var out string
	found := false
	for _, f := range h {
		if f.k != k {
			continue
		}
		if found {
			out += "," + f.v
		} else {
			out, found = f.v, true
		}
	}
	return out, found
}

func (h *headers) add(k, v string) { *h = append(*h, field{k, v}) }

// set replaces every value of k by v, keeping k's first place.
func (h *headers) set(k, v string) {
	for i, f := range *h {
		if f.k == k {
			(*h)[i].v = v
			h.delFrom(k, i+1)
			return
		}
	}
	h.add(k, v)
}

func (h *headers) del(k string) { h.delFrom(k, 0) }

func (h *headers) delFrom(k string, from int) {
	out := (*h)[:from]
	for _, f := range (*h)[from:] {
		if f.k != k {
			out = append(out, f)
		}
	}
	*h = out
}

// byteSize is Envoy's HeaderMap::byteSize: keys and values, no framing.
func (h headers) byteSize() uint64 {
	var n uint64
	for _, f := range h {
		n += uint64(len(f.k) + len(f.v))
	}
	return n
}

// fromHTTP appends a Go header's fields, lower-cased.
func (h *headers) fromHTTP(g http.Header) {
	for k, vs := range g {
		lk := strings.ToLower(k)
		for _, v := range vs {
			h.add(lk, v)
		}
	}
}

// toHTTP is the upstream request's header: no pseudo-headers.
func (h headers) toHTTP() http.Header {
	g := make(http.Header, len(h))
	for _, f := range h {
		if f.k[0] == ':' {
			continue
		}
		g[http.CanonicalHeaderKey(f.k)] = append(g[http.CanonicalHeaderKey(f.k)], f.v)
	}
	return g
}

// apply adds one HeaderValueOption the way the ext_authz filter does for
// OkHttpResponse.headers: its append "defaults to false when used in this
// message" (external_auth.proto), so unset means add-or-override; an
// explicit append_action is honoured.
func (h *headers) apply(o *corev3.HeaderValueOption) {
	k := strings.ToLower(o.GetHeader().GetKey())
	v := o.GetHeader().GetValue()
	if raw := o.GetHeader().GetRawValue(); len(raw) > 0 {
		v = string(raw)
	}
	if k == "" {
		return
	}
	if a := o.GetAppend(); a != nil {
		if a.GetValue() {
			h.add(k, v)
		} else {
			h.set(k, v)
		}
		return
	}
	_, exists := h.get(k)
	switch o.GetAppendAction() {
	case corev3.HeaderValueOption_ADD_IF_ABSENT:
		if !exists {
			h.add(k, v)
		}
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
		if exists {
			h.set(k, v)
		}
	default:
		h.set(k, v)
	}
}

// headerMap is ext_proc's HttpHeaders.headers: every value in raw_value
// (external_processor.proto: "The header value is encoded in the
// raw_value field").
func (h headers) headerMap() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, len(h))}
	for i, f := range h {
		m.Headers[i] = &corev3.HeaderValue{Key: f.k, RawValue: []byte(f.v)}
	}
	return m
}

// pick returns the named headers' values (the access logger's
// additional_*_to_log): the first value of each, as Envoy's
// HeaderMap::get does in http_grpc_access_log_impl.cc.
func (h headers) pick(names []string) map[string]string {
	var out map[string]string
	for _, n := range names {
		if v, ok := h.get(n); ok {
			if out == nil {
				out = make(map[string]string, len(names))
			}
			out[n] = v
		}
	}
	return out
}
