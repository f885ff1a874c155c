package app

import (
	"strings"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// configView is what /debug/config shows. It is an allow-list: a field
// appears only when it is copied here, so a secret added to the rules or
// flags later (API keys, passwords) stays out until someone decides how
// to show it, and credentials that are shown go through redactURL.
type configView struct {
	Version string       `json:"version"`
	Rules   string       `json:"rules_path"`
	Store   storeView    `json:"store"`
	Domains []domainView `json:"domains"`
}

type storeView struct {
	Kind string `json:"kind"`
	URL  string `json:"url,omitempty"`
}

type domainView struct {
	Name        string        `json:"domain"`
	Source      string        `json:"source,omitempty"`
	Tiers       *tiersView    `json:"tiers,omitempty"`
	Shedding    *sheddingView `json:"shedding,omitempty"`
	Breakers    []breakerView `json:"breakers,omitempty"`
	Descriptors []ruleView    `json:"descriptors"`
}

type sheddingView struct {
	Steps      []shedStepView `json:"steps"`
	Hysteresis float64        `json:"hysteresis,omitempty"`
	Hold       string         `json:"hold,omitempty"`
	Shadow     bool           `json:"shadow,omitempty"`
	MinFactor  float64        `json:"min_factor,omitempty"`
	Scope      string         `json:"scope"`
	// BurstFloor is shown, in effect, when a step turns bursts down.
	BurstFloor string       `json:"burst_floor,omitempty"`
	Control    *controlView `json:"control,omitempty"`
}

// controlView is shedding.control with its defaults filled.
type controlView struct {
	Key             string           `json:"key"`
	Capacity        map[string]int64 `json:"capacity"`
	DefaultCapacity int64            `json:"default_capacity,omitempty"`
	Target          float64          `json:"target"`
	Sheddable       []string         `json:"sheddable"`
	Interval        string           `json:"interval"`
	Window          string           `json:"window"`
	Dwell           string           `json:"dwell"`
	Quantum         float64          `json:"quantum"`
	Lease           string           `json:"lease"`
	Grace           string           `json:"grace"`
}

func newControlView(c *limit.Control) *controlView {
	if c == nil {
		return nil
	}
	d := c.WithDefaults()
	v := &controlView{
		Key: d.Key, Capacity: map[string]int64{}, DefaultCapacity: d.DefaultCapacity, Target: d.Target, Sheddable: d.Sheddable,
		Interval: d.Interval.String(), Window: d.Window.String(), Dwell: d.Dwell.String(), Quantum: d.Quantum,
		Lease: d.Lease.String(), Grace: d.Grace.String(),
	}
	for k, n := range d.Capacity {
		v.Capacity[k] = n
	}
	return v
}

type shedStepView struct {
	Above       float64  `json:"above"`
	Shed        []string `json:"shed,omitempty"`
	AdmitOnly   []string `json:"admit_only,omitempty"`
	LimitFactor float64  `json:"limit_factor,omitempty"`
	NoBurst     bool     `json:"no_burst,omitempty"`
	Continuous  bool     `json:"continuous,omitempty"`
}

func newSheddingView(s *limit.Shedding) *sheddingView {
	if s == nil {
		return nil
	}
	v := &sheddingView{Steps: []shedStepView{}, Hysteresis: s.Hysteresis, Shadow: s.Shadow, MinFactor: s.MinFactor, Scope: s.Scope, Control: newControlView(s.Control)}
	if v.Scope == "" {
		v.Scope = limit.ScopeGlobal
	}
	if s.Hold > 0 {
		v.Hold = s.Hold.String()
	}
	for _, st := range s.Steps {
		v.Steps = append(v.Steps, shedStepView{Above: st.Above, Shed: st.Shed, AdmitOnly: st.AdmitOnly, LimitFactor: st.LimitFactor, NoBurst: st.NoBurst, Continuous: st.Continuous})
		if st.NoBurst {
			v.BurstFloor = s.EffectiveBurstFloor().String()
		}
	}
	return v
}

// breakerView is a breaker's configuration with its defaults filled.
type breakerView struct {
	Key              string  `json:"key"`
	FailureThreshold uint64  `json:"failure_threshold"`
	FailureRate      float64 `json:"failure_rate,omitempty"`
	MinRequests      uint64  `json:"min_requests,omitempty"`
	Window           string  `json:"window"`
	OpenFor          string  `json:"open_for"`
	HalfOpenProbes   uint64  `json:"half_open_probes"`
	CloseAfter       uint64  `json:"close_after"`
	ProbeLease       string  `json:"probe_lease"`
	Timeout          string  `json:"timeout,omitempty"`
	Cache            string  `json:"cache"`
}

func newBreakerViews(bs []limit.BreakerConfig) []breakerView {
	var out []breakerView
	for _, b := range bs {
		if full, err := b.WithDefaults(); err == nil {
			b = full
		}
		v := breakerView{Key: b.Key, FailureThreshold: b.FailureThreshold, FailureRate: b.FailureRate, MinRequests: b.MinRequests,
			Window: b.Window.String(), OpenFor: b.OpenFor.String(),
			HalfOpenProbes: b.HalfOpenProbes, CloseAfter: b.CloseAfter, ProbeLease: b.ProbeLease.String(), Cache: b.Cache.String()}
		if b.Timeout > 0 {
			v.Timeout = b.Timeout.String()
		}
		out = append(out, v)
	}
	return out
}

type tiersView struct {
	Key     string             `json:"key"`
	Default string             `json:"default"`
	Plans   map[string]float64 `json:"plans"`
}

func newTiersView(t *limit.Tiers) *tiersView {
	if t == nil {
		return nil
	}
	return &tiersView{Key: t.Key, Default: t.Default, Plans: t.Plans}
}

type ruleView struct {
	ID             string     `json:"id"`
	Key            string     `json:"key"`
	Value          string     `json:"value,omitempty"`
	RateLimit      *limitView `json:"rate_limit,omitempty"`
	TokenLimit     *limitView `json:"token_limit,omitempty"`
	Unlimited      bool       `json:"unlimited,omitempty"`
	Shadow         bool       `json:"shadow_mode,omitempty"`
	DetailedMetric bool       `json:"detailed_metric,omitempty"`
	Replaces       []string   `json:"replaces,omitempty"`
	Descriptors    []ruleView `json:"descriptors,omitempty"`
}

type limitView struct {
	Name string `json:"name,omitempty"`
	// Exactly one of the two amounts is set, as in the rule file; 0 is a
	// real limit, hence the pointers.
	RequestsPerUnit *uint64 `json:"requests_per_unit,omitempty"`
	TokensPerUnit   *uint64 `json:"tokens_per_unit,omitempty"`
	Unit            string  `json:"unit"`
	UnitMultiplier  uint32  `json:"unit_multiplier,omitempty"`
	Algorithm       string  `json:"algorithm"`
	Burst           uint64  `json:"burst,omitempty"`
	Buckets         uint16  `json:"buckets,omitempty"`
}

func newConfigView(version, rulesPath, redisURL string, rs *limit.RuleSet) configView {
	v := configView{
		Version: version,
		Rules:   rulesPath,
		Store:   storeView{Kind: storeKind(redisURL), URL: redactURL(redisURL)},
		Domains: []domainView{},
	}
	for _, d := range rs.Domains() {
		v.Domains = append(v.Domains, domainView{Name: d.Name, Source: d.Source, Tiers: newTiersView(d.Tiers),
			Shedding: newSheddingView(d.Shedding), Breakers: newBreakerViews(d.Breakers), Descriptors: ruleViews(d.Descriptors)})
	}
	return v
}

func ruleViews(rules []*limit.Rule) []ruleView {
	out := make([]ruleView, 0, len(rules))
	for _, r := range rules {
		out = append(out, ruleView{
			ID:             r.ID,
			Key:            r.Key,
			Value:          r.Value,
			RateLimit:      newLimitView(r.RateLimit),
			TokenLimit:     newLimitView(r.TokenLimit),
			Unlimited:      r.Unlimited,
			Shadow:         r.Shadow,
			DetailedMetric: r.DetailedMetric,
			Replaces:       r.Replaces,
			Descriptors:    childViews(r.Children),
		})
	}
	return out
}

func childViews(rules []*limit.Rule) []ruleView {
	if len(rules) == 0 {
		return nil
	}
	return ruleViews(rules)
}

func newLimitView(l *limit.Limit) *limitView {
	if l == nil {
		return nil
	}
	amount := l.Amount
	v := &limitView{
		Name:      l.Name,
		Unit:      l.Unit.String(),
		Algorithm: l.Algorithm.String(),
		Burst:     l.Burst,
		Buckets:   l.Buckets,
	}
	if l.Multiplier > 1 {
		v.UnitMultiplier = l.Multiplier
	}
	if l.Kind == limit.Tokens {
		v.TokensPerUnit = &amount
	} else {
		v.RequestsPerUnit = &amount
	}
	return v
}

// redactURL hides the password of a Redis URL the way redisstore's
// errors do: the userinfo ends at the last '@', so a password with an
// unescaped '/', '?' or '@' is still hidden whole.
func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		if strings.Contains(raw, "@") {
			return "xxxxx"
		}
		return raw
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return raw
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return raw
	}
	return scheme + "://" + user + ":xxxxx@" + rest[at+1:]
}
