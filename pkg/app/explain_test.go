package app

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// runExplainCmd runs `tollgate explain args...` and returns its exit
// code, stdout and stderr.
func runExplainCmd(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr buffer
	a := &App{Stdout: &stdout, Stderr: &stderr}
	code := a.Run(context.Background(), append([]string{"explain"}, args...))
	return code, stdout.String(), stderr.String()
}

// explainJSON runs explain with --json and decodes its answer.
func explainJSON(t testing.TB, args ...string) explainOutput {
	t.Helper()
	code, out, errOut := runExplainCmd(t, append(args, "--json")...)
	if code != ExitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	var got explainOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	return got
}

// rulesFile writes one rule file and returns its path.
func rulesFile(t testing.TB, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, p, yaml)
	return p
}

const exampleRules = "../../config/inference.yaml"

// key is limit.Key for a domain "inference" counter.
func key(kind limit.Kind, alg limit.Algorithm, w time.Duration, kv ...string) string {
	var es []limit.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, limit.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return limit.Key(kind, alg, w, "inference", es)
}

func TestExplainExampleRules(t *testing.T) {
	t.Parallel()
	tenantModel := key(limit.Requests, limit.SlidingWindow, time.Minute, "tenant", "acme", "model", "gpt-4o")
	tenantTokens := key(limit.Tokens, limit.SlidingWindow, time.Hour, "tenant", "acme", "model", "gpt-4o")
	global := key(limit.Requests, limit.TokenBucket, time.Minute, "model", "gpt-4o")
	type charge struct {
		Key  string
		Cost int64
	}
	tests := []struct {
		name        string
		give        []string
		wantRules   []string // per descriptor, "" for none
		wantTier    string
		wantMult    float64
		wantDefault bool
		wantLimits  []uint64 // effective amounts, in charge order
		wantCharges []charge
		wantRefused bool
		wantVerdict string // a substring
	}{
		{
			name:        "tenant and model, premium",
			give:        []string{"--descriptor", "tenant=acme,model=gpt-4o,tier=premium"},
			wantRules:   []string{"tenant.model_gpt-4o"},
			wantTier:    "premium",
			wantMult:    3,
			wantLimits:  []uint64{300, 1_500_000},
			wantCharges: []charge{{tenantModel, 1}, {tenantTokens, 0}},
			wantVerdict: "admitted if the store has room: charges +1 to " + tenantModel,
		},
		{
			name:        "no tier is the default",
			give:        []string{"--descriptor", "tenant=acme,model=gpt-4o"},
			wantRules:   []string{"tenant.model_gpt-4o"},
			wantTier:    "free",
			wantMult:    1,
			wantDefault: true,
			wantLimits:  []uint64{100, 500_000},
			wantCharges: []charge{{tenantModel, 1}, {tenantTokens, 0}},
			wantVerdict: "admitted if the store has room",
		},
		{
			name:        "a made-up tier is the default",
			give:        []string{"--descriptor", "tenant=acme,tier=gold"},
			wantRules:   []string{"tenant"},
			wantTier:    "free",
			wantMult:    1,
			wantDefault: true,
			wantLimits:  []uint64{600},
			wantCharges: []charge{{key(limit.Requests, limit.SlidingWindow, time.Minute, "tenant", "acme"), 1}},
		},
		{
			name:        "hits charge the token budget",
			give:        []string{"--descriptor", "tenant=acme,model=gpt-4o,tier=standard", "--hits", "700"},
			wantRules:   []string{"tenant.model_gpt-4o"},
			wantTier:    "standard",
			wantMult:    2,
			wantLimits:  []uint64{200, 1_000_000},
			wantCharges: []charge{{tenantModel, 1}, {tenantTokens, 700}},
		},
		{
			name:        "global model bucket at pressure, standard: fair-shared, so pressure scales it and the plan does not",
			give:        []string{"--descriptor", "model=gpt-4o", "--descriptor", "tier=standard", "--pressure", "0.97"},
			wantRules:   []string{"model_gpt-4o", ""},
			wantTier:    "standard",
			wantMult:    2,
			wantLimits:  []uint64{7_000},
			wantCharges: []charge{{global, 1}},
			wantVerdict: "refused first if the breaker model=gpt-4o is open",
		},
		{
			name:        "free is shed at 0.9",
			give:        []string{"--descriptor", "tenant=acme,tier=free", "--pressure", "0.9"},
			wantRules:   []string{""},
			wantTier:    "free",
			wantMult:    1,
			wantRefused: true,
			wantVerdict: "refused: shed at pressure 0.9 (tier free); OVER_LIMIT with retry-after 5s, nothing charged",
		},
		{
			name:        "only premium at 0.99",
			give:        []string{"--descriptor", "tenant=acme,tier=standard", "--pressure", "0.99"},
			wantRules:   []string{""},
			wantTier:    "standard",
			wantMult:    2,
			wantRefused: true,
			wantVerdict: "refused: shed at pressure 0.99 (tier standard)",
		},
		{
			name:        "shadow rule",
			give:        []string{"--descriptor", "user=u1"},
			wantRules:   []string{"user"},
			wantTier:    "free",
			wantMult:    1,
			wantDefault: true,
			wantLimits:  []uint64{30},
			wantCharges: []charge{{key(limit.Requests, limit.SlidingWindow, time.Minute, "user", "u1"), 1}},
		},
		{
			name:        "no rule",
			give:        []string{"--descriptor", "path=/v1"},
			wantRules:   []string{""},
			wantTier:    "free",
			wantMult:    1,
			wantDefault: true,
			wantCharges: []charge{},
			wantVerdict: "admitted: no rule counts this request (OK, nothing charged)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := explainJSON(t, append([]string{"--config", exampleRules, "--domain", "inference"}, tt.give...)...)
			var rules []string
			for _, d := range got.Descriptors {
				rules = append(rules, d.Rule)
			}
			if diff := cmp.Diff(tt.wantRules, rules); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
			if got.Tier == nil || got.Tier.Name != tt.wantTier || got.Tier.Multiplier != tt.wantMult || got.Tier.Default != tt.wantDefault {
				t.Errorf("tier = %+v, want %s x%v default %v", got.Tier, tt.wantTier, tt.wantMult, tt.wantDefault)
			}
			var limits []uint64
			for _, d := range got.Descriptors {
				for _, l := range d.Limits {
					limits = append(limits, l.Effective)
				}
			}
			if diff := cmp.Diff(tt.wantLimits, limits); diff != "" {
				t.Errorf("effective limits (-want +got):\n%s", diff)
			}
			var charges []charge
			for _, c := range got.Charges {
				charges = append(charges, charge{c.Key, c.Cost})
			}
			if tt.wantCharges == nil {
				tt.wantCharges = []charge{}
			}
			if charges == nil {
				charges = []charge{}
			}
			if diff := cmp.Diff(tt.wantCharges, charges); diff != "" {
				t.Errorf("charges (-want +got):\n%s", diff)
			}
			if got.Refused != tt.wantRefused {
				t.Errorf("refused = %v, want %v", got.Refused, tt.wantRefused)
			}
			if !strings.Contains(got.Verdict, tt.wantVerdict) {
				t.Errorf("verdict = %q, want it to contain %q", got.Verdict, tt.wantVerdict)
			}
		})
	}
}

// TestExplainMatching covers how rules match, on small inline rule files.
func TestExplainMatching(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      string // rules
		args      []string
		wantRule  []string
		wantSteps []string // "entry match rule" of the first descriptor
		wantDesc  func(t *testing.T, ds []descriptorExplain)
		wantKeys  []string
		wantNotes []string
	}{
		{
			name: "exact beats wildcard beats key only",
			give: `domain: inference
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: model
    value: gpt-*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: model
    value: gpt-4*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 4}
`,
			args:      []string{"--descriptor", "model=gpt-4o", "--descriptor", "model=gpt-4-turbo", "--descriptor", "model=gpt-3", "--descriptor", "model=llama"},
			wantRule:  []string{"model_gpt-4o", "model_gpt-4*", "model_gpt-*", "model"},
			wantSteps: []string{"model=gpt-4o exact value model_gpt-4o"},
			wantKeys: []string{
				key(limit.Requests, limit.SlidingWindow, time.Minute, "model", "gpt-4o"),
				key(limit.Requests, limit.SlidingWindow, time.Minute, "model", "gpt-4-turbo"),
				key(limit.Requests, limit.SlidingWindow, time.Minute, "model", "gpt-3"),
				key(limit.Requests, limit.SlidingWindow, time.Minute, "model", "llama"),
			},
		},
		{
			name: "share_threshold keys by the wildcard",
			give: `domain: inference
descriptors:
  - key: model
    value: gpt-*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 2}
`,
			args:     []string{"--descriptor", "model=gpt-4o"},
			wantRule: []string{"model_gpt-*"},
			wantKeys: []string{key(limit.Requests, limit.SlidingWindow, time.Second, "model", "gpt-*")},
		},
		{
			name: "replaces, unlimited and a node without a limit",
			give: `domain: inference
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 30, name: user_minute}
  - key: user_hourly
    rate_limit: {unit: hour, requests_per_unit: 500, replaces: [{name: user_minute}]}
  - key: tenant
    value: internal
    rate_limit: {unlimited: true}
  - key: org
    descriptors:
      - key: team
        rate_limit: {unit: minute, requests_per_unit: 5}
`,
			args:      []string{"--descriptor", "user=u1", "--descriptor", "user_hourly=u1", "--descriptor", "tenant=internal", "--descriptor", "org=o1", "--descriptor", "org=o1,team=t,x=y"},
			wantRule:  []string{"user", "user_hourly", "tenant_internal", "", ""},
			wantSteps: []string{"user=u1 key only user"},
			wantDesc: func(t *testing.T, ds []descriptorExplain) {
				if !ds[0].Replaced || len(ds[0].Limits) != 0 {
					t.Errorf("user: replaced %v with limits %+v, want replaced and none", ds[0].Replaced, ds[0].Limits)
				}
				if !slices.Equal(ds[1].Replaces, []string{"user_minute"}) {
					t.Errorf("user_hourly replaces %v", ds[1].Replaces)
				}
				if !ds[2].Unlimited || len(ds[2].Limits) != 0 {
					t.Errorf("tenant_internal: unlimited %v, limits %+v", ds[2].Unlimited, ds[2].Limits)
				}
				if want := "no rule: its last entry reached org, which has no limit"; ds[3].Why != want {
					t.Errorf("org: why %q, want %q", ds[3].Why, want)
				}
				if want := "no rule: nothing matches x=y there"; ds[4].Why != want {
					t.Errorf("org.team.x: why %q, want %q", ds[4].Why, want)
				}
			},
			wantKeys: []string{key(limit.Requests, limit.SlidingWindow, time.Hour, "user_hourly", "u1")},
		},
		{
			name: "scope model: the model's own score",
			give: `domain: inference
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: model
    value: llama
    rate_limit: {unit: minute, requests_per_unit: 100}
shedding:
  steps:
    - {above: 0.5, limit_factor: 0.5}
  scope: model
`,
			args:     []string{"--descriptor", "model=gpt-4o", "--pressure", "0.6", "--scope", "gpt-4o"},
			wantRule: []string{"model_gpt-4o"},
			wantDesc: func(t *testing.T, ds []descriptorExplain) {
				if got := ds[0].Limits[0].Effective; got != 50 {
					t.Errorf("effective = %d, want 50", got)
				}
			},
			wantKeys: []string{key(limit.Requests, limit.SlidingWindow, time.Minute, "model", "gpt-4o")},
		},
		{
			name: "scope model: another model's score changes nothing",
			give: `domain: inference
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: model
    value: llama
    rate_limit: {unit: minute, requests_per_unit: 100}
shedding:
  steps:
    - {above: 0.5, limit_factor: 0.5}
  scope: model
`,
			args:     []string{"--descriptor", "model=gpt-4o", "--pressure", "0.6", "--scope", "llama"},
			wantRule: []string{"model_gpt-4o"},
			wantDesc: func(t *testing.T, ds []descriptorExplain) {
				if got := ds[0].Limits[0].Effective; got != 100 {
					t.Errorf("effective = %d, want 100", got)
				}
			},
			wantKeys:  []string{key(limit.Requests, limit.SlidingWindow, time.Minute, "model", "gpt-4o")},
			wantNotes: []string{"the request reads scope gpt-4o, not llama: the pressure given changes nothing for it"},
		},
		{
			name: "scope global: a model scope changes nothing",
			give: `domain: inference
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 100}
shedding:
  steps:
    - {above: 0.5, limit_factor: 0.5}
`,
			args:      []string{"--descriptor", "model=m", "--pressure", "0.6", "--scope", "m"},
			wantRule:  []string{"model"},
			wantKeys:  []string{key(limit.Requests, limit.SlidingWindow, time.Minute, "model", "m")},
			wantNotes: []string{`domain "inference" sheds by the global score: --scope m changes nothing`},
		},
		{
			name: "no shedding",
			give: `domain: inference
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
`,
			args:      []string{"--descriptor", "model=m", "--pressure", "1"},
			wantRule:  []string{"model"},
			wantKeys:  []string{key(limit.Requests, limit.FixedWindow, time.Minute, "model", "m")},
			wantNotes: []string{`domain "inference" has no shedding: --pressure changes nothing`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := explainJSON(t, append([]string{"--config", rulesFile(t, tt.give), "--domain", "inference"}, tt.args...)...)
			var rules, keys []string
			for _, d := range got.Descriptors {
				rules = append(rules, d.Rule)
			}
			for _, c := range got.Charges {
				keys = append(keys, c.Key)
			}
			if diff := cmp.Diff(tt.wantRule, rules); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantKeys, keys); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantNotes, got.Notes); diff != "" {
				t.Errorf("notes (-want +got):\n%s", diff)
			}
			if tt.wantSteps != nil {
				var steps []string
				for _, s := range got.Descriptors[0].Steps {
					steps = append(steps, strings.TrimSpace(s.Entry+" "+s.Match+" "+s.Rule))
				}
				if diff := cmp.Diff(tt.wantSteps, steps); diff != "" {
					t.Errorf("steps (-want +got):\n%s", diff)
				}
			}
			if tt.wantDesc != nil {
				tt.wantDesc(t, got.Descriptors)
			}
		})
	}
}

// TestExplainText pins the text of one rich case: plan, pressure step,
// two descriptors, a breaker.
func TestExplainText(t *testing.T) {
	t.Parallel()
	code, out, errOut := runExplainCmd(t, "--config", exampleRules, "--domain", "inference",
		"--descriptor", "tenant=acme,model=gpt-4o,tier=premium", "--descriptor", "model=gpt-4o", "--pressure", "0.97")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	k1 := key(limit.Requests, limit.SlidingWindow, time.Minute, "tenant", "acme", "model", "gpt-4o")
	k2 := key(limit.Tokens, limit.SlidingWindow, time.Hour, "tenant", "acme", "model", "gpt-4o")
	k3 := key(limit.Requests, limit.TokenBucket, time.Minute, "model", "gpt-4o")
	want := `domain inference (../../config/inference.yaml)
tier: premium (x3), named by the request
pressure: 0.97 on scope global: shedding level 1 (step above 0.95) active, sheds free, limits x0.7, bursts down to their floor
  the request reads scope global
descriptor 1: tenant=acme,model=gpt-4o,tier=premium
  matched as: tenant=acme,model=gpt-4o (tier entries removed)
  tenant=acme -> tenant (key only)
  model=gpt-4o -> tenant.model_gpt-4o (exact value)
  rule tenant.model_gpt-4o: matched: its last entry model=gpt-4o lands on it (exact value)
  rate_limit tenant_gpt4o_requests: 210/minute sliding_window (rule 100, x3 plan = 300, x0.7 pressure = 210)
    charges +1 to ` + k1 + `
  token_limit tenant_gpt4o_tokens: 1050000/hour sliding_window (rule 500000, x3 plan = 1500000, x0.7 pressure = 1050000); a cost of 0 checks that budget is left
    charges +0 to ` + k2 + `
descriptor 2: model=gpt-4o
  model=gpt-4o -> model_gpt-4o (exact value)
  rule model_gpt-4o: matched: its last entry model=gpt-4o lands on it (exact value)
  rate_limit gpt4o_global: 7000/minute token_bucket burst 117 (rule 10000, x0.7 pressure = 7000)
    charges +1 to ` + k3 + `
    fair_share: one budget shared by tenant values, not multiplied by the plan; tenant=acme (member 0724d383f4f6de0f), weight 3 (plan)
      min_share 0, backlog 1s, quantum 1, credit 8, max_keys 256
breaker model=gpt-4o: consulted after shedding, before the limits
verdict: admitted if the store has room: charges +1 to ` + k1 + ` (tenant_gpt4o_requests: 210/minute sliding_window), +0 to ` + k2 + ` (tenant_gpt4o_tokens: 1050000/hour sliding_window), +1 to ` + k3 + ` (gpt4o_global: 7000/minute token_bucket burst 117); all or nothing; refused first if the breaker model=gpt-4o is open
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("text (-want +got):\n%s", diff)
	}
}

func TestExplainExitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		give     []string
		wantCode int
		wantErr  string
	}{
		{"no domain", []string{"--config", exampleRules, "--descriptor", "a=b"}, ExitUsage, "--domain is required"},
		{"no descriptor", []string{"--config", exampleRules, "--domain", "inference"}, ExitUsage, "at least one --descriptor"},
		{"unknown flag", []string{"--nope"}, ExitUsage, "flag provided but not defined"},
		{"pressure out of range", []string{"--domain", "inference", "--descriptor", "a=b", "--pressure", "1.5"}, ExitUsage, `"1.5" is not a number in [0,1]`},
		{"stray argument", []string{"--domain", "inference", "--descriptor", "a=b", "extra"}, ExitUsage, "unexpected arguments"},
		{"unknown domain", []string{"--config", exampleRules, "--domain", "nope", "--descriptor", "a=b"}, ExitError, `domain "nope" is not in ../../config/inference.yaml (domains: inference)`},
		{"bad descriptor", []string{"--config", exampleRules, "--domain", "inference", "--descriptor", "tenant"}, ExitError, `--descriptor "tenant": entry 1 "tenant" has no '=': want key=value`},
		{"missing rules", []string{"--config", "does-not-exist.yaml", "--domain", "inference", "--descriptor", "a=b"}, ExitError, "load rules"},
		{"help", []string{"-h"}, ExitOK, "Usage: tollgate explain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := runExplainCmd(t, tt.give...)
			if code != tt.wantCode || !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errOut, tt.wantCode, tt.wantErr)
			}
		})
	}
}

func TestParseDescriptor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    string
		want    []limit.Entry
		wantErr string
	}{
		{"one", "tenant=acme", []limit.Entry{{Key: "tenant", Value: "acme"}}, ""},
		{"several", "tenant=acme,model=gpt-4o,tier=free", []limit.Entry{{Key: "tenant", Value: "acme"}, {Key: "model", Value: "gpt-4o"}, {Key: "tier", Value: "free"}}, ""},
		{"empty value", "tenant=", []limit.Entry{{Key: "tenant", Value: ""}}, ""},
		{"equals in a value", "q=a=b", []limit.Entry{{Key: "q", Value: "a=b"}}, ""},
		{"escapes", `path=/a\,b,k\=x=\\`, []limit.Entry{{Key: "path", Value: "/a,b"}, {Key: "k=x", Value: `\`}}, ""},
		{"empty", "", nil, "empty descriptor"},
		{"no equals", "tenant", nil, `entry 1 "tenant" has no '='`},
		{"empty key", "=v", nil, "entry 1 has an empty key"},
		{"trailing comma", "a=b,", nil, `entry 2 "" has no '='`},
		{"trailing backslash", `a=b\`, nil, "trailing backslash"},
		{"too many entries", strings.Repeat("a=b,", limit.MaxEntries) + "a=b", nil, "more than 32 entries"},
		{"long value", "a=" + strings.Repeat("v", limit.MaxValueBytes+1), nil, "value is 1025 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseDescriptor(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzExplainDescriptor checks that the descriptor parser never panics,
// keeps the caps, and that what it accepts prints back to the same
// entries.
func FuzzExplainDescriptor(f *testing.F) {
	for _, s := range []string{
		"tenant=acme", "tenant=acme,model=gpt-4o,tier=free", "tenant=", "q=a=b", `path=/a\,b,k\=x=\\`,
		"", "tenant", "=v", "a=b,", `a=b\`, ",,", "a=b,,c=d", "\x00=\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		entries, err := parseDescriptor(s)
		if err != nil {
			return
		}
		if len(entries) == 0 || len(entries) > limit.MaxEntries {
			t.Fatalf("%q: %d entries", s, len(entries))
		}
		for _, e := range entries {
			if e.Key == "" || len(e.Key) > limit.MaxEntryKeyBytes || len(e.Value) > limit.MaxValueBytes {
				t.Fatalf("%q: entry %+v breaks the caps", s, e)
			}
		}
		again, err := parseDescriptor(formatDescriptor(entries))
		if err != nil {
			t.Fatalf("%q: reparse %q: %v", s, formatDescriptor(entries), err)
		}
		if !slices.Equal(entries, again) {
			t.Fatalf("%q: %+v, then %+v", s, entries, again)
		}
	})
}
