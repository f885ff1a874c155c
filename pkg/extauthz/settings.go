package extauthz

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Defaults of the authz config's optional keys.
const (
	DefaultCharsPerToken    = 4
	DefaultMaxTokens        = 256
	DefaultMaxBodyBytes     = 1 << 20
	DefaultModelBodyField   = "model"
	maxMaxBodyBytes         = 64 << 20
	maxCharsPerToken        = 1000
	maxDefaultMaxTokens     = 1 << 32
	maxAPIKeyHeaders        = 16
	maxHeaderNameBytes      = 256
	maxDescriptorsInSetting = limit.MaxDescriptors
)

// Defaults of estimate.image_tokens.
const (
	// DefaultImageTokensLow is what OpenAI charges a low-detail image.
	DefaultImageTokensLow = 85
	// DefaultImageTokensHigh is the most OpenAI's tile formula charges a
	// high-detail image on its GPT-4o-class models: 85 + 170 a tile, at
	// most 2x4 tiles of 512 px (768 x 2048 after scaling). It prices
	// auto, too: the upstream may pick high.
	DefaultImageTokensHigh = 85 + 170*8
	maxImageTokens         = 1 << 20
)

// DefaultAPIKeyHeaders are the headers searched for an API key when the
// config lists none: authorization takes "Bearer <key>".
var DefaultAPIKeyHeaders = []string{"authorization", "x-api-key"}

// The keys each mapping of the authz config accepts.
var (
	settingsKeys = []string{
		"domain", "keys_file", "api_key_headers", "require_api_key", "trusted_headers",
		"model", "descriptors", "estimate", "usage_header",
	}
	trustedKeys  = []string{"tenant", "tier"}
	modelKeys    = []string{"body_field", "header"}
	entryKeys    = []string{"key", "from"}
	estimateKeys = []string{"chars_per_token", "default_max_tokens", "max_body_bytes", "partial_body", "image_tokens"}
	imageKeys    = []string{"low", "high", "auto"}
)

// SourceKind says where a descriptor entry's value comes from.
type SourceKind uint8

const (
	FromTenant SourceKind = iota + 1
	FromTier
	FromModel
	// FromPath is the request path without its query.
	FromPath
	FromMethod
	// FromHeader is a request header; Source.Arg names it, in lower case.
	FromHeader
	// FromLiteral is Source.Arg itself.
	FromLiteral
)

// Source is where one descriptor entry's value comes from.
type Source struct {
	Kind SourceKind
	Arg  string
}

// Entry is one descriptor entry of the mapping: a key and where its value
// comes from.
type Entry struct {
	Key    string
	Source Source
}

// Settings is a loaded authz config: who calls, what they ask for, what it
// costs, and which descriptors Check decides on. It is immutable once
// built; a reload builds a new one.
//
// The file:
//
//	domain: inference                  # (Required) the rules domain Check decides in; a route may
//	                                   #   override it with the context extension "tollgate.domain"
//	keys_file: keys.yaml               # (Optional) API keys (pkg/authn), relative to this file
//	api_key_headers: [authorization, x-api-key]  # (Optional) default shown; authorization takes "Bearer <key>"
//	require_api_key: true              # (Optional) default true; false: a call without a key takes
//	                                   #   tenant and tier from trusted_headers (set by a trusted layer);
//	                                   #   a key that is sent is still checked when keys_file is set
//	trusted_headers: {tenant: x-tenant-id, tier: x-tier}  # (Required when require_api_key is false)
//	model: {body_field: model, header: x-model}  # (Optional) body first, then header; default body_field: model
//	descriptors:                       # (Required) each item is one descriptor; an entry whose
//	  - [{key: tenant, from: tenant}]  #   value is empty drops its descriptor
//	  - [{key: tenant, from: tenant}, {key: model, from: model}]
//	  # from: tenant | tier | model | path (without the query) | method | "header:NAME" | "literal:VALUE"
//	estimate:                          # (Optional) defaults shown
//	  chars_per_token: 4
//	  default_max_tokens: 256          # the completion when the body gives no max_tokens
//	  max_body_bytes: 1048576          # the largest body admitted, by its Content-Length (or the bytes
//	                                   #   Envoy received, when more); a larger one is 413. Set Envoy's
//	                                   #   with_request_body.max_request_bytes to the same value, so that
//	                                   #   every body admitted is checked whole (docs/partial-bodies.md)
//	  partial_body: refuse             # a body Envoy cut at max_request_bytes, or did not send:
//	                                   #   refuse: admitted only when the part sent holds the model
//	                                   #   (if body_field reads one) and Content-Length gives its size,
//	                                   #   charged to that model from that size; otherwise 413 (500 when
//	                                   #   Envoy sent no body: set with_request_body)
//	                                   #   estimate: UNSAFE, every such body is admitted; the model from
//	                                   #   the part sent or the header (the client's choice), the size
//	                                   #   the largest known; a client can escape a model's limits
//	  image_tokens: {low: 85, high: 1445, auto: 1445}  # an image part's cost by its detail;
//	                                   #   auto also prices an unknown detail or none (docs/estimate.md)
//	usage_header: x-usage-total-tokens # (Optional) the response header whose integer value the access
//	                                   #   log reconciles as the request's actual tokens; default none
type Settings struct {
	// Source is the file the settings came from.
	Source string
	Domain string
	// KeysFile is the keys file's path, resolved against Source's
	// directory; empty when none. Keys is the file loaded.
	KeysFile string
	Keys     *authn.Keys
	// APIKeyHeaders are the headers searched for a key, lower case.
	APIKeyHeaders []string
	RequireAPIKey bool
	// TenantHeader and TierHeader are the trusted headers read when
	// RequireAPIKey is false and a call presents no key.
	TenantHeader, TierHeader string
	// ModelBodyField is the body's top-level field naming the model;
	// ModelHeader the header read when the body has none ("" for none).
	ModelBodyField string
	ModelHeader    string
	Descriptors    [][]Entry
	// CharsPerToken converts the prompt's characters to tokens.
	CharsPerToken float64
	// DefaultMaxTokens is the completion estimate when the body gives no
	// max_tokens or max_completion_tokens.
	DefaultMaxTokens uint64
	// MaxBodyBytes is the largest body Check admits, by the whole body's
	// size, however much of it Envoy sent; a larger one is 413.
	MaxBodyBytes int64
	// PartialBody is what Check does with a body Envoy cut or did not
	// send.
	PartialBody PartialBody
	// ImageTokens is an image part's cost in tokens, by its detail.
	ImageTokens [imageDetails]uint64
	// UsageHeader is the response header the access log reads actual
	// usage from, lower case; empty when none.
	UsageHeader string

	// domainLine and descriptorLines are where domain and each of
	// Descriptors are, for Against.
	domainLine      int
	descriptorLines []int
}

// LoadSettings reads an authz config and the keys file it names.
// Problems in either file yield a config.Errors naming file and line; a
// file that cannot be read yields a wrapped I/O error.
func LoadSettings(path string) (*Settings, error) {
	s, _, err := load(path)
	return s, err
}

// ParseSettings compiles an authz config's bytes; name is used in errors
// and resolves a relative keys_file. It does not load the keys. The error,
// when there is one, is a config.Errors with every problem found.
func ParseSettings(name string, data []byte) (*Settings, error) {
	p := &settingsParser{w: config.NewWalker(name)}
	var s *Settings
	if root := p.w.Document(data, "file is empty; an authz config needs at least a domain and descriptors"); root != nil {
		s = p.file(name, root)
	}
	if err := p.w.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

type settingsParser struct {
	w *config.Walker
}

func (p *settingsParser) file(name string, root *yaml.Node) *Settings {
	f, _ := p.w.Mapping(root, "", settingsKeys)
	if f == nil {
		return nil
	}
	at := p.w.Resolve(root)
	s := &Settings{
		Source:           name,
		APIKeyHeaders:    DefaultAPIKeyHeaders,
		RequireAPIKey:    true,
		ModelBodyField:   DefaultModelBodyField,
		CharsPerToken:    DefaultCharsPerToken,
		DefaultMaxTokens: DefaultMaxTokens,
		MaxBodyBytes:     DefaultMaxBodyBytes,
		ImageTokens: [imageDetails]uint64{
			ImageLow: DefaultImageTokensLow, ImageHigh: DefaultImageTokensHigh, ImageAuto: DefaultImageTokensHigh,
		},
	}
	if n, has := f["domain"]; !has {
		p.w.Addf(at, "", "domain is required")
	} else if d, ok := p.w.Name(n, "domain", limit.MaxDomainBytes); ok {
		s.Domain, s.domainLine = d, p.w.Resolve(n).Line
	}
	p.callers(f, at, s)
	if n, has := f["model"]; has {
		p.model(n, s)
	}
	if n, has := f["descriptors"]; !has {
		p.w.Addf(at, "", "descriptors is required")
	} else {
		s.Descriptors, s.descriptorLines = p.descriptors(n, "descriptors")
	}
	if n, has := f["estimate"]; has {
		p.estimate(n, s)
	}
	if n, has := f["usage_header"]; has {
		s.UsageHeader = p.headerName(n, "usage_header")
	}
	return s
}

// callers reads how a call is identified: keys_file, api_key_headers,
// require_api_key and trusted_headers, from f, the file's top-level
// mapping at node at, into s.
func (p *settingsParser) callers(f map[string]*yaml.Node, at *yaml.Node, s *Settings) {
	if n, has := f["keys_file"]; has {
		if k, ok := p.w.Str(n, "keys_file"); ok && k != "" {
			if !filepath.IsAbs(k) {
				k = filepath.Join(filepath.Dir(s.Source), k)
			}
			s.KeysFile = k
		} else if ok {
			p.w.Addf(n, "keys_file", "is empty")
		}
	}
	if n, has := f["api_key_headers"]; has {
		s.APIKeyHeaders = p.headerList(n, "api_key_headers")
	}
	if n, has := f["require_api_key"]; has {
		// Flag reports a value that is not a boolean and reads it as
		// false; keep the default then, so one mistake is one problem.
		s.RequireAPIKey = p.w.Flag(f, "require_api_key", "") || !saysFalse(p.w.Resolve(n))
	}
	if n, has := f["trusted_headers"]; has {
		if t, _ := p.w.Mapping(n, "trusted_headers", trustedKeys); t != nil {
			if v, has := t["tenant"]; has {
				s.TenantHeader = p.headerName(v, "trusted_headers.tenant")
			}
			if v, has := t["tier"]; has {
				s.TierHeader = p.headerName(v, "trusted_headers.tier")
			}
		}
	}
	switch {
	case s.RequireAPIKey && s.KeysFile == "":
		p.w.Addf(at, "", "keys_file is required while require_api_key is true (the default)")
	case !s.RequireAPIKey && s.TenantHeader == "":
		p.w.Addf(at, "", "trusted_headers.tenant is required when require_api_key is false: a call without a key takes its tenant from it")
	}
}

// model reads model: {body_field, header} into s.
func (p *settingsParser) model(n *yaml.Node, s *Settings) {
	m, _ := p.w.Mapping(n, "model", modelKeys)
	if m == nil {
		return
	}
	if v, has := m["body_field"]; has {
		if b, ok := p.w.Str(v, "model.body_field"); ok {
			s.ModelBodyField = b // "" reads no model from the body
		}
	}
	if v, has := m["header"]; has {
		s.ModelHeader = p.headerName(v, "model.header")
	}
}

// estimate reads estimate: over the defaults already in s.
func (p *settingsParser) estimate(n *yaml.Node, s *Settings) {
	e, _ := p.w.Mapping(n, "estimate", estimateKeys)
	if e == nil {
		return
	}
	if v, has := e["chars_per_token"]; has {
		s.CharsPerToken = p.positive(v, "estimate.chars_per_token", maxCharsPerToken)
	}
	if v, has := e["default_max_tokens"]; has {
		s.DefaultMaxTokens, _ = p.w.Uint(v, "estimate.default_max_tokens", 0, maxDefaultMaxTokens)
	}
	if v, has := e["max_body_bytes"]; has {
		b, _ := p.w.Uint(v, "estimate.max_body_bytes", 1, maxMaxBodyBytes)
		s.MaxBodyBytes = int64(b)
	}
	if v, has := e["partial_body"]; has {
		s.PartialBody = p.partialBody(v, "estimate.partial_body")
	}
	if v, has := e["image_tokens"]; has {
		p.imageTokens(v, &s.ImageTokens)
	}
}

// partialBody reads a PartialBody by its name; an unknown name is the
// default, reported.
func (p *settingsParser) partialBody(n *yaml.Node, path string) PartialBody {
	name, ok := p.w.Str(n, path)
	if !ok {
		return PartialRefuse
	}
	for i, pn := range partialBodyNames {
		if name == pn {
			return PartialBody(i)
		}
	}
	p.w.Addf(n, path, "%q is not one of %s", name, strings.Join(partialBodyNames[:], "|"))
	return PartialRefuse
}

// imageTokens reads estimate.image_tokens over the defaults in costs.
func (p *settingsParser) imageTokens(n *yaml.Node, costs *[imageDetails]uint64) {
	m, _ := p.w.Mapping(n, "estimate.image_tokens", imageKeys)
	for d, name := range [imageDetails]string{ImageLow: "low", ImageHigh: "high", ImageAuto: "auto"} {
		if v, has := m[name]; has {
			if c, ok := p.w.Uint(v, "estimate.image_tokens."+name, 0, maxImageTokens); ok {
				costs[d] = c
			}
		}
	}
}

// saysFalse reports whether n is a false that Walker.Flag accepts.
func saysFalse(n *yaml.Node) bool {
	if n.Kind != yaml.ScalarNode {
		return false
	}
	switch n.Value {
	case "false", "False", "FALSE", "n", "N", "no", "No", "NO", "off", "Off", "OFF":
		return n.ShortTag() == "!!bool" || n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0
	}
	return false
}

// headerName reads a header name and returns it in lower case, as Envoy
// passes header names to Check.
func (p *settingsParser) headerName(n *yaml.Node, path string) string {
	s, ok := p.w.Str(n, path)
	if !ok {
		return ""
	}
	if !validHeaderName(s) {
		p.w.Addf(n, path, "%q is not a header name", s)
		return ""
	}
	return strings.ToLower(s)
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110
// token characters), at most 256 bytes.
func validHeaderName(s string) bool {
	if s == "" || len(s) > maxHeaderNameBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func (p *settingsParser) headerList(n *yaml.Node, path string) []string {
	l := p.w.Resolve(n)
	if l.Kind != yaml.SequenceNode {
		p.w.Addf(l, path, "want a list of header names, got %s", config.Shape(l))
		return nil
	}
	if len(l.Content) == 0 || len(l.Content) > maxAPIKeyHeaders {
		p.w.Addf(l, path, "want 1 to %d header names, got %d", maxAPIKeyHeaders, len(l.Content))
		return nil
	}
	out := make([]string, 0, len(l.Content))
	for i, c := range l.Content {
		if h := p.headerName(c, fmt.Sprintf("%s[%d]", path, i)); h != "" {
			out = append(out, h)
		}
	}
	return out
}

func (p *settingsParser) descriptors(n *yaml.Node, path string) (out [][]Entry, lines []int) {
	l := p.w.Resolve(n)
	if l.Kind != yaml.SequenceNode {
		p.w.Addf(l, path, "want a list of descriptors (each a list of {key, from}), got %s", config.Shape(l))
		return nil, nil
	}
	if len(l.Content) == 0 || len(l.Content) > maxDescriptorsInSetting {
		p.w.Addf(l, path, "want 1 to %d descriptors, got %d", maxDescriptorsInSetting, len(l.Content))
		return nil, nil
	}
	out = make([][]Entry, 0, len(l.Content))
	for i, d := range l.Content {
		if p.w.Stopped() {
			break
		}
		dp := fmt.Sprintf("%s[%d]", path, i)
		dn := p.w.Resolve(d)
		if dn.Kind != yaml.SequenceNode {
			p.w.Addf(dn, dp, "want a list of entries {key, from}, got %s", config.Shape(dn))
			continue
		}
		if len(dn.Content) == 0 || len(dn.Content) > limit.MaxEntries {
			p.w.Addf(dn, dp, "want 1 to %d entries, got %d", limit.MaxEntries, len(dn.Content))
			continue
		}
		entries := make([]Entry, 0, len(dn.Content))
		for j, e := range dn.Content {
			if en, ok := p.entry(e, fmt.Sprintf("%s[%d]", dp, j)); ok {
				entries = append(entries, en)
			}
		}
		if len(entries) == len(dn.Content) {
			out = append(out, entries)
			lines = append(lines, dn.Line)
		}
	}
	return out, lines
}

func (p *settingsParser) entry(n *yaml.Node, path string) (Entry, bool) {
	var e Entry
	f, ok := p.w.Mapping(n, path, entryKeys)
	if f == nil {
		return e, false
	}
	at := p.w.Resolve(n)
	if v, has := f["key"]; !has {
		p.w.Addf(at, path, "key is required")
		ok = false
	} else if k, good := p.w.Name(v, path+".key", limit.MaxEntryKeyBytes); good {
		e.Key = k
	} else {
		ok = false
	}
	if v, has := f["from"]; !has {
		p.w.Addf(at, path, "from is required")
		ok = false
	} else if s, good := p.w.Str(v, path+".from"); good {
		src, msg := parseSource(s)
		if msg != "" {
			p.w.Addf(v, path+".from", "%s", msg)
			ok = false
		}
		e.Source = src
	} else {
		ok = false
	}
	return e, ok
}

// parseSource reads a descriptor entry's from; msg says what is wrong.
func parseSource(s string) (src Source, msg string) {
	switch s {
	case "tenant":
		return Source{Kind: FromTenant}, ""
	case "tier":
		return Source{Kind: FromTier}, ""
	case "model":
		return Source{Kind: FromModel}, ""
	case "path":
		return Source{Kind: FromPath}, ""
	case "method":
		return Source{Kind: FromMethod}, ""
	}
	if name, ok := strings.CutPrefix(s, "header:"); ok {
		if !validHeaderName(name) {
			return src, fmt.Sprintf("%q is not a header name", name)
		}
		return Source{Kind: FromHeader, Arg: strings.ToLower(name)}, ""
	}
	if v, ok := strings.CutPrefix(s, "literal:"); ok {
		switch {
		case v == "":
			return src, "a literal value is empty"
		case len(v) > limit.MaxValueBytes:
			return src, fmt.Sprintf("the literal is %d bytes, more than %d", len(v), limit.MaxValueBytes)
		}
		return Source{Kind: FromLiteral, Arg: v}, ""
	}
	return src, fmt.Sprintf("%q is not one of tenant|tier|model|path|method|header:NAME|literal:VALUE", s)
}

// positive reads a number in (0, max].
func (p *settingsParser) positive(n *yaml.Node, path string, max float64) float64 {
	r := p.w.Resolve(n)
	if r.Kind == yaml.ScalarNode && (r.ShortTag() == "!!int" || r.ShortTag() == "!!float") {
		if v, err := strconv.ParseFloat(r.Value, 64); err == nil && !math.IsNaN(v) && v > 0 && v <= max {
			return v
		}
	}
	got := config.Shape(r)
	if r.Kind == yaml.ScalarNode {
		got = strconv.Quote(r.Value)
	}
	p.w.Addf(r, path, "want a number greater than 0 and at most %g, got %s", max, got)
	return DefaultCharsPerToken
}
