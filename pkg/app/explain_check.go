package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/authn"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// explainKey is the key explain presents for a key given by hash: the
// Check runs against a keys set holding only it, as the listed key's
// identity. It never leaves the process.
const explainKey = "tollgate-explain-stand-in-key"

// checkExplain is explain's account of one ext_authz Check: who the key
// is, the descriptors and estimate the authz config makes of the request,
// the rules' explanation of that decision, and the answer Check gives on
// a fresh store (nothing used yet).
type checkExplain struct {
	Identity    identityExplain `json:"identity"`
	Descriptors []string        `json:"descriptors"`
	// Tokens is the request's token estimate (reserved on token limits),
	// 0 with none.
	Tokens uint64         `json:"estimate_tokens"`
	Model  string         `json:"model,omitempty"`
	Rules  *explainOutput `json:"rules,omitempty"`
	Answer answerExplain  `json:"answer"`
}

type identityExplain struct {
	// Found: the key is in the keys file and enabled.
	Found     bool              `json:"found"`
	Tenant    string            `json:"tenant,omitempty"`
	Tier      string            `json:"tier,omitempty"`
	KeyName   string            `json:"key_name,omitempty"`
	Overrides map[string]string `json:"overrides,omitempty"`
	How       string            `json:"how"`
}

type answerExplain struct {
	Status  int        `json:"status"`
	Headers [][]string `json:"headers,omitempty"`
	// Upstream are the headers Check adds to the request it admits.
	Upstream [][]string `json:"upstream_headers,omitempty"`
	Body     string     `json:"body,omitempty"`
}

// recorder is a Decider that keeps the request Check asks about and the
// decision, for explain.
type recorder struct {
	*admission.Limiter
	req *limit.Request
}

func (r *recorder) Decide(ctx context.Context, req *limit.Request) (*admission.Decision, error) {
	// Check reuses req once it returns: keep a deep copy.
	cp := *req
	cp.Descriptors = make([]limit.Descriptor, len(req.Descriptors))
	for i, d := range req.Descriptors {
		d.Entries = slices.Clone(d.Entries)
		cp.Descriptors[i] = d
	}
	r.req = &cp
	return r.Limiter.Decide(ctx, req)
}

// runExplainCheck explains the Check f describes under the authz config
// and rules it names.
func runExplainCheck(ctx context.Context, f explainFlags) (*checkExplain, error) {
	rs, err := config.Load(f.config)
	if err != nil {
		return nil, fmt.Errorf("load rules:\n%w", err)
	}
	set, err := extauthz.LoadSettings(f.authzConfig)
	if err != nil {
		return nil, fmt.Errorf("load authz config:\n%w", err)
	}
	if problems, _ := set.Against(rs); len(problems) > 0 {
		return nil, fmt.Errorf("the authz config and the rules disagree (tollgate validate --authz-config says the same):\n%w", problems)
	}
	out := &checkExplain{}
	key := f.apiKey
	id, found := authn.Identity{}, false
	switch {
	case f.apiKeyHash != "":
		b, err := hex.DecodeString(f.apiKeyHash)
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("--api-key-sha256: want 64 hexadecimal digits")
		}
		if id, found = set.Keys.LookupHash([sha256.Size]byte(b)); found {
			cp := *set
			cp.Keys = authn.Single(explainKey, id)
			set, key = &cp, explainKey
		} else {
			key = explainKey // presented, and not listed
		}
	case key != "":
		id, found = set.Keys.Lookup(key)
	}
	out.Identity = identityOf(set, id, found, key != "")

	rec := &recorder{Limiter: admission.NewLimiter(memstore.New(), nil, rs)}
	svc, err := extauthz.New(rec, set, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	in, err := checkRequest(f, set, key)
	if err != nil {
		return nil, err
	}
	resp, err := svc.Check(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("Check failed: %w", err)
	}
	out.Answer = answerOf(resp)
	if req := rec.req; req != nil {
		out.Tokens, out.Model = req.Tokens, req.Model
		for _, d := range req.Descriptors {
			out.Descriptors = append(out.Descriptors, formatDescriptor(d.Entries))
		}
		if dom := rs.Domain(req.Domain); dom != nil {
			ex, err := admission.Explain(dom, req, nil)
			if err != nil {
				return nil, err
			}
			rules := &explainOutput{Domain: dom.Name, Source: dom.Source, Hits: req.Hits}
			rules.fill(dom, req, ex)
			out.Rules = rules
		}
	}
	return out, nil
}

// identityOf describes who key is, never the key.
func identityOf(set *extauthz.Settings, id authn.Identity, found, presented bool) identityExplain {
	switch {
	case !presented && set.RequireAPIKey:
		return identityExplain{How: "no key given, and require_api_key is true: Check answers 401"}
	case !presented:
		return identityExplain{How: "no key given: tenant and tier from the trusted headers (--header)"}
	case !found:
		return identityExplain{How: "the key is not in the keys file, or is disabled: Check answers 401"}
	}
	ie := identityExplain{Found: true, Tenant: id.Tenant, Tier: id.Tier, KeyName: id.KeyName, How: "listed in " + set.KeysFile}
	if len(id.Overrides) > 0 {
		ie.Overrides = map[string]string{}
		for name, o := range id.Overrides {
			v := strconv.FormatUint(o.Amount, 10) // the rule's window kept
			switch {
			case o.Unit == limit.UnitUnknown:
			case o.Multiplier > 1:
				v = fmt.Sprintf("%d per %d %ss", o.Amount, o.Multiplier, o.Unit)
			default:
				v += " per " + o.Unit.String()
			}
			ie.Overrides[name] = v
		}
	}
	return ie
}

// checkRequest is the Check Envoy would send for the request f
// describes, presenting key as the authz config looks for one.
func checkRequest(f explainFlags, set *extauthz.Settings, key string) (*authv3.CheckRequest, error) {
	h := map[string]string{}
	for _, kv := range f.headers {
		name, value, ok := strings.Cut(kv, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("--header %q: want name: value", kv)
		}
		h[strings.ToLower(strings.TrimSpace(name))] = strings.TrimSpace(value)
	}
	if key != "" && len(set.APIKeyHeaders) > 0 {
		name := set.APIKeyHeaders[0]
		if _, given := h[name]; !given {
			if name == "authorization" {
				h[name] = "Bearer " + key
			} else {
				h[name] = key
			}
		}
	}
	var body []byte
	if f.body != "" {
		var err error
		if f.body == "-" {
			body, err = io.ReadAll(io.LimitReader(os.Stdin, set.MaxBodyBytes+1))
		} else {
			body, err = os.ReadFile(f.body)
		}
		if err != nil {
			return nil, fmt.Errorf("--body: %w", err)
		}
		// As Envoy sends a body it buffered whole.
		h[extauthz.PartialBodyHeader] = "false"
		if _, given := h["content-length"]; !given {
			h["content-length"] = strconv.Itoa(len(body))
		}
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: f.method, Path: f.path, Headers: h, RawBody: body, Size: int64(len(body))},
	}}}, nil
}

// answerOf is what Envoy would do with resp.
func answerOf(resp *authv3.CheckResponse) answerExplain {
	pairs := func(hs []*corev3.HeaderValueOption) [][]string {
		var out [][]string
		for _, o := range hs {
			out = append(out, []string{o.GetHeader().GetKey(), o.GetHeader().GetValue()})
		}
		return out
	}
	if ok := resp.GetOkResponse(); ok != nil {
		return answerExplain{Status: 200, Upstream: pairs(ok.GetHeaders()), Headers: pairs(ok.GetResponseHeadersToAdd())}
	}
	d := resp.GetDeniedResponse()
	return answerExplain{Status: int(d.GetStatus().GetCode()), Headers: pairs(d.GetHeaders()), Body: d.GetBody()}
}

// writeText prints the explanation for a person.
func (o *checkExplain) writeText(w io.Writer) {
	id := o.Identity
	if id.Found {
		fmt.Fprintf(w, "identity: tenant %s", id.Tenant)
		if id.Tier != "" {
			fmt.Fprintf(w, ", tier %s", id.Tier)
		} else {
			fmt.Fprint(w, ", no tier (the rules' default plan)")
		}
		if id.KeyName != "" {
			fmt.Fprintf(w, ", key %s", id.KeyName)
		}
		fmt.Fprintf(w, " (%s)\n", id.How)
		names := make([]string, 0, len(id.Overrides))
		for n := range id.Overrides {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			fmt.Fprintf(w, "  override %s: %s\n", n, id.Overrides[n])
		}
	} else {
		fmt.Fprintf(w, "identity: %s\n", id.How)
	}
	if o.Model != "" {
		fmt.Fprintf(w, "model: %s\n", o.Model)
	}
	fmt.Fprintf(w, "estimate: %d tokens\n", o.Tokens)
	for i, d := range o.Descriptors {
		fmt.Fprintf(w, "descriptor %d: %s\n", i+1, d)
	}
	if o.Rules != nil {
		fmt.Fprintln(w)
		o.Rules.writeText(w)
		fmt.Fprintln(w)
	}
	a := o.Answer
	fmt.Fprintf(w, "answer on a fresh store: %d\n", a.Status)
	for _, h := range a.Upstream {
		fmt.Fprintf(w, "  to the upstream: %s: %s\n", h[0], h[1])
	}
	for _, h := range a.Headers {
		fmt.Fprintf(w, "  to the client: %s: %s\n", h[0], h[1])
	}
	if a.Body != "" {
		fmt.Fprintf(w, "  body: %s\n", a.Body)
	}
}

// explainCheck is explain with --authz-config.
func (a *App) explainCheck(ctx context.Context, f explainFlags) int {
	switch {
	case f.domain != "" || len(f.descriptors) > 0:
		fmt.Fprintln(a.Stderr, "tollgate explain: --domain and --descriptor do not go with --authz-config: the authz config makes the descriptors")
		return ExitUsage
	case f.apiKey != "" && f.apiKeyHash != "":
		fmt.Fprintln(a.Stderr, "tollgate explain: give --api-key or --api-key-sha256, not both")
		return ExitUsage
	}
	out, err := runExplainCheck(ctx, f)
	return a.printExplain(out, err, f.json)
}
