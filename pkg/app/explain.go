package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/pkg/admission"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/pressure"
	pressureruntime "github.com/tollgate-dev/tollgate/pkg/pressure/runtime"
)

const explainUsage = `Usage: tollgate explain --config PATH --domain D --descriptor k=v[,k=v...] [--descriptor ...]
                        [--hits N] [--pressure P [--scope global|MODEL]] [--json]
       tollgate explain --config PATH --authz-config FILE [--api-key KEY | --api-key-sha256 HEX]
                        [--header 'name: value' ...] [--method M] [--path P] [--body FILE|-] [--json]

Explains, without a store, what ShouldRateLimit would do with one request: for
each descriptor the rule it matches and why, the plan and its multiplier, the
effective limits, the shedding step at pressure P, the breakers asked and the
store keys charged. The descriptors are one request, as Envoy sends them:
replaces and all-or-nothing apply across them. In a value, write \, \= and \\
for a comma, an equals sign and a backslash.

With --authz-config it explains an ext_authz Check instead: who the API key
is (given, or by the SHA-256 the keys file lists; never printed), the
descriptors and token estimate the authz config makes of the request, the
rules' explanation of that decision, and the answer Check gives on a fresh
store: status, headers and body.

Exit status: 0 explained, 1 bad input (rules, domain, descriptor), 2 usage.

`

// explainFlags are explain's command line.
type explainFlags struct {
	config, domain, scope string
	descriptors           []string
	hits                  uint64
	pressure              float64
	pressureSet, json     bool

	// An ext_authz Check, with authzConfig.
	authzConfig, apiKey, apiKeyHash string
	headers                         []string
	method, path, body              string
}

// explain answers "why was this request limited?" from the rules alone.
func (a *App) explain(ctx context.Context, args []string) int {
	var f explainFlags
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), explainUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.config, "config", "config", "rule file, or directory of *.yaml rule files")
	fs.StringVar(&f.domain, "domain", "", "the request's domain (Required)")
	fs.Func("descriptor", "a descriptor as key=value,key=value (Required; repeat for several)", func(s string) error {
		f.descriptors = append(f.descriptors, s)
		return nil
	})
	fs.Uint64Var(&f.hits, "hits", 0, "the request's hits_addend (0 means 1 for request limits; the tokens of a token limit)")
	fs.Func("pressure", "pressure score in [0,1] of --scope (default: none, no shedding step active)", func(s string) error {
		p, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(p) || p < 0 || p > 1 {
			return fmt.Errorf("%q is not a number in [0,1]", s)
		}
		f.pressure, f.pressureSet = p, true
		return nil
	})
	fs.StringVar(&f.scope, "scope", limit.ScopeGlobal, "the pressure scope --pressure is for: global, or a model's name")
	fs.BoolVar(&f.json, "json", false, "print JSON instead of text")
	fs.StringVar(&f.authzConfig, "authz-config", "", "explain an ext_authz Check under this authz config (and its keys file) instead of descriptors")
	fs.StringVar(&f.apiKey, "api-key", "", "with --authz-config: the API key the request presents (never printed)")
	fs.StringVar(&f.apiKeyHash, "api-key-sha256", "", "with --authz-config: the SHA-256 of the key, as the keys file lists it, instead of --api-key")
	fs.Func("header", "with --authz-config: a request header as 'name: value' (repeat for several)", func(s string) error {
		f.headers = append(f.headers, s)
		return nil
	})
	fs.StringVar(&f.method, "method", "POST", "with --authz-config: the request's method")
	fs.StringVar(&f.path, "path", "/v1/chat/completions", "with --authz-config: the request's path")
	fs.StringVar(&f.body, "body", "", "with --authz-config: a file holding the request body, - for standard input")
	if err := a.parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if f.authzConfig != "" {
		return a.explainCheck(ctx, f)
	}
	switch {
	case f.apiKey != "" || f.apiKeyHash != "" || len(f.headers) > 0 || f.body != "":
		fmt.Fprintln(a.Stderr, "tollgate explain: --api-key, --api-key-sha256, --header and --body need --authz-config")
		return ExitUsage
	case f.domain == "":
		fmt.Fprintln(a.Stderr, "tollgate explain: --domain is required")
		return ExitUsage
	case len(f.descriptors) == 0:
		fmt.Fprintln(a.Stderr, "tollgate explain: at least one --descriptor is required")
		return ExitUsage
	case f.scope == "":
		fmt.Fprintln(a.Stderr, "tollgate explain: --scope is empty")
		return ExitUsage
	}
	out, err := runExplain(f)
	return a.printExplain(out, err, f.json)
}

// printExplain prints an explanation as text or, with asJSON, as JSON;
// err, when set, is why there is none.
func (a *App) printExplain(out interface{ writeText(io.Writer) }, err error, asJSON bool) int {
	if err != nil {
		fmt.Fprintf(a.Stderr, "tollgate explain: %v\n", err)
		return ExitError
	}
	if asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(a.Stderr, "tollgate explain: %v\n", err)
			return ExitError
		}
		return ExitOK
	}
	out.writeText(a.Stdout)
	return ExitOK
}

// runExplain loads the rules and explains the request f describes.
func runExplain(f explainFlags) (*explainOutput, error) {
	req := &limit.Request{Domain: f.domain, Hits: f.hits}
	for i, s := range f.descriptors {
		entries, err := parseDescriptor(s)
		if err != nil {
			return nil, fmt.Errorf("--descriptor %q: %w", s, err)
		}
		if i >= limit.MaxDescriptors {
			return nil, fmt.Errorf("%d descriptors, at most %d", len(f.descriptors), limit.MaxDescriptors)
		}
		req.Descriptors = append(req.Descriptors, limit.Descriptor{Entries: entries})
	}
	rs, err := config.Load(f.config)
	if err != nil {
		return nil, fmt.Errorf("load rules:\n%w", err)
	}
	dom := rs.Domain(f.domain)
	if dom == nil {
		var names []string
		for _, d := range rs.Domains() {
			names = append(names, d.Name)
		}
		return nil, fmt.Errorf("domain %q is not in %s (domains: %s); ShouldRateLimit would answer OK with no limit", f.domain, f.config, strings.Join(names, ", "))
	}
	out := &explainOutput{Domain: dom.Name, Source: dom.Source, Hits: f.hits}
	var shedder admission.Shedder
	if dom.Shedding != nil {
		ps := &pressureExplain{Scope: f.scope, Pressure: f.pressure, Given: f.pressureSet, Level: -1}
		out.Pressure = ps
		if f.pressureSet {
			ev, err := pressure.NewEvaluator(dom.Shedding, limit.SystemClock{})
			if err != nil {
				return nil, fmt.Errorf("domain %q: shedding: %w", dom.Name, err)
			}
			// A fresh Evaluator enters the step of a rising score at once;
			// hysteresis and hold only delay leaving one.
			ev.Update(f.pressure)
			o := ev.Outcome()
			ps.Level, ps.Factor, ps.NoBurst, ps.Shadow = o.Level, o.Factor, o.NoBurst, o.Shadow
			if o.Level >= 0 {
				ps.Above = dom.Shedding.Steps[o.Level].Above
			}
			for _, t := range dom.Tiers.PlanNames() {
				if o.Sheds(t) {
					ps.ShedTiers = append(ps.ShedTiers, t)
				}
			}
			// The scopes serve gives the domain, each at pressure 0 but
			// --scope: a model the domain names reads its own score, any
			// other falls back to global, as the Gate does in serve.
			names := []string{limit.ScopeGlobal}
			if dom.Shedding.Scope == limit.ScopeModel {
				names = append(names, pressureruntime.ModelsOf(dom.Descriptors)...)
			}
			gate := pressure.NewGate()
			var entries []pressure.GateEntry
			for _, name := range names {
				e := ev
				if name != f.scope {
					if e, err = pressure.NewEvaluator(dom.Shedding, limit.SystemClock{}); err != nil {
						return nil, err
					}
				}
				entries = append(entries, pressure.GateEntry{Domain: dom.Name, Scope: name, Evaluator: e})
			}
			gate.Set(entries...)
			ps.scopes = names
			shedder = gate
		}
	} else if f.pressureSet {
		out.Notes = append(out.Notes, fmt.Sprintf("domain %q has no shedding: --pressure changes nothing", dom.Name))
	}

	ex, err := admission.Explain(dom, req, shedder)
	if err != nil {
		return nil, err
	}
	out.fill(dom, req, ex)
	if ps := out.Pressure; ps != nil && ps.Given {
		// The scope whose Evaluator the request reads: its model's when
		// the domain has one, else global.
		read := ex.Scope
		if !slices.Contains(ps.scopes, read) {
			read = limit.ScopeGlobal
		}
		ps.ReadScope = read
		reaches := read == f.scope
		switch {
		case reaches:
		case dom.Shedding.Scope != limit.ScopeModel:
			out.Notes = append(out.Notes, fmt.Sprintf("domain %q sheds by the global score: --scope %s changes nothing", dom.Name, f.scope))
		case f.scope != limit.ScopeGlobal && !slices.Contains(ps.scopes, f.scope):
			out.Notes = append(out.Notes, fmt.Sprintf("domain %q names no exact model %q, so it keeps no score for it: its requests read the global score", dom.Name, f.scope))
		default:
			out.Notes = append(out.Notes, fmt.Sprintf("the request reads scope %s, not %s: the pressure given changes nothing for it", read, f.scope))
		}
		ps.Applies = reaches && ps.Level >= 0
	}
	return out, nil
}

// parseDescriptor parses "key=value,key=value". A backslash escapes the
// next byte, so a value can hold ',' '=' and '\'. Each key is non-empty;
// the caps are the RLS adapter's (limit.MaxEntries, ...).
func parseDescriptor(s string) ([]limit.Entry, error) {
	if s == "" {
		return nil, errors.New("empty descriptor: want key=value[,key=value...]")
	}
	var (
		entries []limit.Entry
		cur     strings.Builder
		key     string
		haveKey bool
	)
	end := func() error {
		if !haveKey {
			return fmt.Errorf("entry %d %q has no '=': want key=value", len(entries)+1, cur.String())
		}
		if key == "" {
			return fmt.Errorf("entry %d has an empty key", len(entries)+1)
		}
		if len(entries) == limit.MaxEntries {
			return fmt.Errorf("more than %d entries", limit.MaxEntries)
		}
		if len(key) > limit.MaxEntryKeyBytes {
			return fmt.Errorf("entry %d: key is %d bytes, at most %d", len(entries)+1, len(key), limit.MaxEntryKeyBytes)
		}
		if cur.Len() > limit.MaxValueBytes {
			return fmt.Errorf("entry %d (%s): value is %d bytes, at most %d", len(entries)+1, key, cur.Len(), limit.MaxValueBytes)
		}
		entries = append(entries, limit.Entry{Key: key, Value: cur.String()})
		cur.Reset()
		key, haveKey = "", false
		return nil
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			if i+1 == len(s) {
				return nil, errors.New("a trailing backslash escapes nothing")
			}
			i++
			cur.WriteByte(s[i])
		case c == '=' && !haveKey:
			key, haveKey = cur.String(), true
			cur.Reset()
		case c == ',':
			if err := end(); err != nil {
				return nil, err
			}
		default:
			cur.WriteByte(c)
		}
	}
	if err := end(); err != nil {
		return nil, err
	}
	return entries, nil
}

// formatDescriptor is parseDescriptor's inverse.
func formatDescriptor(entries []limit.Entry) string {
	var b strings.Builder
	esc := strings.NewReplacer(`\`, `\\`, `,`, `\,`, `=`, `\=`)
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(esc.Replace(e.Key))
		b.WriteByte('=')
		b.WriteString(esc.Replace(e.Value))
	}
	return b.String()
}

// explainOutput is explain's answer, printed as text or JSON.
type explainOutput struct {
	Domain      string              `json:"domain"`
	Source      string              `json:"source,omitempty"`
	Hits        uint64              `json:"hits"`
	Tier        *tierExplain        `json:"tier,omitempty"`
	Pressure    *pressureExplain    `json:"pressure,omitempty"`
	Descriptors []descriptorExplain `json:"descriptors"`
	Breakers    []breakerExplain    `json:"breakers,omitempty"`
	RetryBudget *retryBudgetExplain `json:"retry_budget,omitempty"`
	// Charges are every store key the request would charge, all or nothing.
	Charges []chargeExplain `json:"charges"`
	// Refused is set when the request is refused whatever the store holds.
	Refused bool     `json:"refused"`
	Verdict string   `json:"verdict"`
	Notes   []string `json:"notes,omitempty"`
}

type tierExplain struct {
	Name       string  `json:"name"`
	Multiplier float64 `json:"multiplier"`
	// Given is the plan the request named; Default is set when it named
	// none or one not listed.
	Given   string `json:"given,omitempty"`
	Default bool   `json:"default"`
}

type pressureExplain struct {
	// Given is false when --pressure was not given: no step is active.
	Given    bool    `json:"given"`
	Pressure float64 `json:"pressure"`
	Scope    string  `json:"scope"`
	// ReadScope is the scope the domain reads for this request.
	ReadScope string `json:"read_scope,omitempty"`
	// Applies: the given pressure reaches the request and a step is active.
	Applies bool `json:"applies"`
	// Level is the active step (-1: none), Above its threshold.
	Level     int      `json:"level"`
	Above     float64  `json:"above,omitempty"`
	ShedTiers []string `json:"shed_tiers,omitempty"`
	Factor    float64  `json:"factor,omitempty"`
	NoBurst   bool     `json:"no_burst,omitempty"`
	Shadow    bool     `json:"shadow,omitempty"`

	scopes []string // the domain's scopes, as serve keeps them
}

type descriptorExplain struct {
	Descriptor string `json:"descriptor"`
	// Matched are the entries as matched: tier entries removed.
	Matched string        `json:"matched"`
	Steps   []stepExplain `json:"steps"`
	// Rule is the matched rule's ID, "" for none; Why says how it matched
	// or why nothing did.
	Rule      string         `json:"rule,omitempty"`
	Why       string         `json:"why"`
	Unlimited bool           `json:"unlimited,omitempty"`
	Shadow    bool           `json:"shadow,omitempty"`
	Replaced  bool           `json:"replaced,omitempty"`
	Replaces  []string       `json:"replaces,omitempty"`
	Limits    []limitExplain `json:"limits,omitempty"`
}

type stepExplain struct {
	Entry string `json:"entry"`
	Match string `json:"match"`
	Rule  string `json:"rule,omitempty"`
}

type limitExplain struct {
	// Kind is rate_limit, token_limit or max_concurrent.
	Kind      string `json:"kind"`
	Name      string `json:"name,omitempty"`
	Algorithm string `json:"algorithm,omitempty"`
	Window    string `json:"window,omitempty"`
	// Base is the rule's amount, Planned after the plan multiplier,
	// Effective after pressure too (what the store checks).
	Base      uint64 `json:"base,omitempty"`
	Planned   uint64 `json:"planned,omitempty"`
	Effective uint64 `json:"effective"`
	Burst     uint64 `json:"burst,omitempty"`
	Cost      int64  `json:"cost"`
	Key       string `json:"key"`
	Shadow    bool   `json:"shadow,omitempty"`
	// Fair is set on a fair-shared limit (explain_fair.go).
	Fair *fairExplain `json:"fair_share,omitempty"`
}

type breakerExplain struct {
	Key  string `json:"key"`
	Name string `json:"name,omitempty"`
	// Consulted: the request carries the key, so the breaker is asked.
	Consulted bool `json:"consulted"`
}

type chargeExplain struct {
	Key  string `json:"key"`
	Cost int64  `json:"cost"`
	// Limit is "tenant_gpt4o_requests: 300/minute sliding_window".
	Limit  string `json:"limit"`
	Shadow bool   `json:"shadow,omitempty"`
}

// fill turns ex into o.
func (o *explainOutput) fill(dom *limit.Domain, req *limit.Request, ex *admission.Explanation) {
	if dom.Tiers != nil {
		o.Tier = &tierExplain{Name: ex.Tier, Multiplier: ex.Multiplier, Given: ex.TierGiven, Default: ex.TierDefaulted}
	}
	for i, de := range ex.Descriptors {
		d := descriptorExplain{Descriptor: formatDescriptor(req.Descriptors[i].Entries), Matched: formatDescriptor(de.Entries)}
		for _, st := range de.Steps {
			s := stepExplain{Entry: formatDescriptor([]limit.Entry{st.Entry}), Match: st.Kind.String()}
			if st.Rule != nil {
				s.Rule = st.Rule.ID
			}
			d.Steps = append(d.Steps, s)
		}
		switch last := len(de.Steps) - 1; {
		case ex.Refused:
			d.Why = "not matched: shedding refused the request first"
		case len(de.Entries) == 0:
			d.Why = "no rule: the descriptor holds only tier entries, which are removed before matching"
		case de.Rule != nil:
			d.Rule = de.Rule.ID
			d.Why = fmt.Sprintf("matched: its last entry %s lands on it (%s)", d.Steps[last].Entry, de.Steps[last].Kind)
		case de.Steps[last].Rule == nil:
			d.Why = fmt.Sprintf("no rule: nothing matches %s there", d.Steps[last].Entry)
		default:
			d.Why = fmt.Sprintf("no rule: its last entry reached %s, which has no limit", de.Steps[last].Rule.ID)
		}
		if r := de.Rule; r != nil {
			d.Unlimited, d.Shadow, d.Replaced, d.Replaces = r.Unlimited, r.Shadow, de.Replaced, r.Replaces
		}
		for _, k := range de.Charges {
			d.Limits = append(d.Limits, limitOf(ex.Charges[k]))
		}
		o.Descriptors = append(o.Descriptors, d)
	}
	for _, b := range ex.Breakers {
		o.Breakers = append(o.Breakers, breakerExplain{Key: b.Key, Name: b.Name, Consulted: b.Name != ""})
	}
	o.Charges = []chargeExplain{}
	for _, c := range ex.Charges {
		l := limitOf(c)
		o.Charges = append(o.Charges, chargeExplain{Key: c.Charge.Key, Cost: c.Charge.Cost, Limit: l.summary(), Shadow: c.Charge.Shadow})
	}
	o.RetryBudget = explainRetryBudget(dom)
	o.Refused = ex.Refused
	o.Verdict = o.verdict(ex)
	if n := queueNote(dom, ex.Tier); n != "" {
		o.Notes = append(o.Notes, n)
	}
}

func limitOf(c admission.ChargeExplanation) limitExplain {
	l := limitExplain{Cost: c.Charge.Cost, Key: c.Charge.Key, Shadow: c.Charge.Shadow, Effective: c.Charge.Amount}
	if c.Limit == nil {
		l.Kind = "max_concurrent"
		l.Window = "lease " + c.Charge.Window.String()
		return l
	}
	l.Kind = "rate_limit"
	if c.Limit.Kind == limit.Tokens {
		l.Kind = "token_limit"
	}
	l.Name, l.Algorithm, l.Window = c.Limit.Name, c.Limit.Algorithm.String(), window(c.Limit)
	if c.Limit.Algorithm == limit.TokenBucket {
		l.Burst = c.Limit.EffectiveBurst()
	}
	if c.Base != nil {
		l.Base, l.Planned = c.Base.Amount, c.Planned.Amount
	}
	l.Fair = fairOf(c)
	return l
}

func window(l *limit.Limit) string {
	if l.Multiplier > 1 {
		return fmt.Sprintf("%d %ss", l.Multiplier, l.Unit)
	}
	return l.Unit.String()
}

func (l limitExplain) summary() string {
	name := l.Name
	if name == "" {
		name = l.Kind
	}
	if l.Kind == "max_concurrent" {
		return fmt.Sprintf("%s: %d in flight (%s)", name, l.Effective, l.Window)
	}
	s := fmt.Sprintf("%s: %d/%s %s", name, l.Effective, l.Window, l.Algorithm)
	if l.Burst > 0 {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	return s
}

func (o *explainOutput) verdict(ex *admission.Explanation) string {
	if ex.Refused {
		return fmt.Sprintf("refused: shed at pressure %v (tier %s); OVER_LIMIT with retry-after %v, nothing charged",
			o.Pressure.Pressure, ex.Tier, ex.RetryAfter)
	}
	var b strings.Builder
	if len(o.Charges) == 0 {
		b.WriteString("admitted: no rule counts this request (OK, nothing charged)")
	} else {
		b.WriteString("admitted if the store has room: charges ")
		for i, c := range o.Charges {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%+d to %s (%s)", c.Cost, c.Key, c.Limit)
		}
		b.WriteString("; all or nothing")
	}
	var open []string
	for _, br := range o.Breakers {
		if br.Consulted {
			open = append(open, fmt.Sprintf("%s=%s", br.Key, br.Name))
		}
	}
	if len(open) > 0 {
		fmt.Fprintf(&b, "; refused first if the breaker %s is open", strings.Join(open, ", "))
	}
	if ex.ShadowShed {
		b.WriteString("; shadow shedding would have refused it (counted as shadow_shed)")
	}
	return b.String()
}

// writeText prints o for a person.
func (o *explainOutput) writeText(w io.Writer) {
	fmt.Fprintf(w, "domain %s (%s)\n", o.Domain, o.Source)
	if t := o.Tier; t != nil {
		how := "named by the request"
		switch {
		case t.Given == "" && t.Default:
			how = "the default: the request names no plan"
		case t.Default:
			how = fmt.Sprintf("the default: the request's %q is not a plan", t.Given)
		}
		fmt.Fprintf(w, "tier: %s (x%v), %s\n", t.Name, t.Multiplier, how)
	}
	if p := o.Pressure; p != nil {
		switch {
		case !p.Given:
			fmt.Fprintln(w, "pressure: not given (no shedding step active)")
		case p.Level < 0:
			fmt.Fprintf(w, "pressure: %v on scope %s: below every shedding step\n", p.Pressure, p.Scope)
		default:
			fmt.Fprintf(w, "pressure: %v on scope %s: shedding level %d (step above %v) active", p.Pressure, p.Scope, p.Level, p.Above)
			if len(p.ShedTiers) > 0 {
				fmt.Fprintf(w, ", sheds %s", strings.Join(p.ShedTiers, ", "))
			}
			if p.Factor < 1 {
				fmt.Fprintf(w, ", limits x%v", p.Factor)
			}
			if p.NoBurst {
				fmt.Fprint(w, ", bursts down to their floor")
			}
			if p.Shadow {
				fmt.Fprint(w, " (shadow: applies nothing)")
			}
			fmt.Fprintln(w)
		}
		if p.Given && p.ReadScope != "" {
			fmt.Fprintf(w, "  the request reads scope %s\n", p.ReadScope)
		}
	}
	for i, d := range o.Descriptors {
		fmt.Fprintf(w, "descriptor %d: %s\n", i+1, d.Descriptor)
		if d.Matched != d.Descriptor {
			fmt.Fprintf(w, "  matched as: %s (tier entries removed)\n", d.Matched)
		}
		for _, s := range d.Steps {
			if s.Rule != "" {
				fmt.Fprintf(w, "  %s -> %s (%s)\n", s.Entry, s.Rule, s.Match)
			} else {
				fmt.Fprintf(w, "  %s -> %s\n", s.Entry, s.Match)
			}
		}
		if d.Rule != "" {
			fmt.Fprintf(w, "  rule %s: %s\n", d.Rule, d.Why)
		} else {
			fmt.Fprintf(w, "  %s\n", d.Why)
		}
		if d.Unlimited {
			fmt.Fprintln(w, "  unlimited: answered OK, nothing counted")
		}
		if d.Shadow {
			fmt.Fprintln(w, "  shadow_mode: counted and reported, never denies")
		}
		if len(d.Replaces) > 0 {
			fmt.Fprintf(w, "  replaces %s when they match the same request\n", strings.Join(d.Replaces, ", "))
		}
		if d.Replaced {
			fmt.Fprintln(w, "  replaced: another matched rule's replaces removes a limit of this one")
		}
		for _, l := range d.Limits {
			fmt.Fprintf(w, "  %s %s", l.Kind, l.summary())
			if l.Base != 0 && (l.Planned != l.Base || l.Effective != l.Planned) {
				fmt.Fprintf(w, " (rule %d", l.Base)
				if l.Planned != l.Base {
					fmt.Fprintf(w, ", x%v plan = %d", o.Tier.Multiplier, l.Planned)
				}
				if l.Effective != l.Planned {
					fmt.Fprintf(w, ", x%v pressure = %d", o.Pressure.Factor, l.Effective)
				}
				fmt.Fprint(w, ")")
			}
			if l.Kind == "token_limit" && l.Cost == 0 {
				fmt.Fprint(w, "; a cost of 0 checks that budget is left")
			}
			fmt.Fprintf(w, "\n    charges %+d to %s\n", l.Cost, l.Key)
			l.Fair.writeText(w)
		}
	}
	for _, b := range o.Breakers {
		if b.Consulted {
			fmt.Fprintf(w, "breaker %s=%s: consulted after shedding, before the limits\n", b.Key, b.Name)
		} else {
			fmt.Fprintf(w, "breaker %s: not consulted (no %s entry)\n", b.Key, b.Key)
		}
	}
	o.RetryBudget.writeText(w)
	for _, n := range o.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintf(w, "verdict: %s\n", o.Verdict)
}
