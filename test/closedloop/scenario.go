package closedloop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The traffic of issue 13: steady 94 requests/s (premium 28, standard 28,
// free 38), 70% of the upstream's ~134/s, on gpt-4o (the model the shipped
// rules limit). Tenants are many enough that no per-tenant limit of
// config/inference.yaml (gpt-4o: 100/min x plan) bites, even with free
// x10: a free tenant sends 0.095/s steady and 0.95/s (57/min) in the
// spike, a standard one 1.4/s (84/min of 200), a premium one 2.3/s (140/min
// of 300). The denials a run sees are then the control loop's.
const (
	PremiumRate, StandardRate, FreeRate = 28.0, 28.0, 38.0
	premiumTenants, standardTenants     = 12, 20
	freeTenants                         = 400
	// SpikeFactor is the free tier's spike multiplier.
	SpikeFactor = 10
	// Model is what every class calls.
	Model = "gpt-4o"
	// hotRate is the hot tenant's rate in the Redis scenario: 3/s
	// against its 100/min (free) gpt-4o limit.
	hotRate  = 3.0
	hotLimit = 100
)

// Upstream capacity as the issue sets it: 32 slots, a queue of 128, 504
// after 500ms in the queue.
var IssueUpstream = UpstreamConfig{Slots: 32, Queue: 128, QueueTimeout: 500 * time.Millisecond, Seed: 13}

// Phase is one stretch of a scenario: each class's rate multiplier (a
// class not named runs at 1) and what happens as it begins.
type Phase struct {
	Name     string
	Duration time.Duration
	Scale    map[string]float64
	Enter    func(e *Env)
}

// Env is what a phase's Enter may act on.
type Env struct {
	T        testing.TB
	Upstream Upstream
	Cluster  *Cluster
}

// Scenario is one closed-loop run and the laws it is judged by.
type Scenario struct {
	Name string
	// NoShedding runs on the shipped rules without their shedding (and
	// control) sections: the comparison.
	NoShedding bool
	// StreamFraction of every class's requests are SSE.
	StreamFraction float64
	// Hot adds the Redis scenario's tenant driven over its limit.
	Hot    bool
	Phases []Phase
	// ScrapeEvery is how often replicas and the upstream are sampled.
	ScrapeEvery time.Duration
	Laws        func(*Run, LawParams) []Law
	// Comparison: the laws are reported, not asserted.
	Comparison bool
	// Budgets: read each tenant's settled token spend at the end.
	Budgets bool
	// RateScale multiplies every class's rate (the smoke test's modest
	// load); 0 means 1.
	RateScale float64
	// Warmup is left out of the steady phase's figures; 0 means 5s.
	Warmup time.Duration
	// Rules, when set, makes the scenario's rules from the shipped ones
	// (after NoShedding's cut).
	Rules func(shipped string) (string, error)
	// Flags are given to every replica after TollgateFlags.
	Flags []string
	// Tenants, when set, is how many tenants each tier's rate is spread
	// over, in place of the issue's 12/20/400.
	Tenants map[string]int
}

// Bench is what scenarios run on: the two parts other packages provide,
// the tollgate binary, and where output goes.
type Bench struct {
	NewUpstream func(UpstreamConfig) Upstream
	NewGateway  NewGatewayFunc
	Mode        GatewayMode
	Bin         string
	Out         string
	// Replicas is how many tollgate processes share Redis (3).
	Replicas int
	// MaxInFlight bounds the driver's outstanding requests.
	MaxInFlight int
	// Spend reads a tenant's settled gpt-4o token spend from Redis; nil
	// leaves the budget law unmeasured.
	Spend func(ctx context.Context, c *Cluster, tenant string) (int64, error)
}

// Scaled returns the issue's scenarios with every phase's duration
// multiplied by scale (TOLLGATE_E2E_SCALE); the laws' own thresholds
// (5 s, 30 s, 2 s) are not scaled.
func Scaled(scale float64) []Scenario {
	d := func(s float64) time.Duration { return time.Duration(s * scale * float64(time.Second)) }
	free10 := map[string]float64{"free": SpikeFactor}
	low := map[string]float64{"premium": 0.2, "standard": 0.2, "free": 0.2}
	spike := []Phase{
		{Name: PhaseSteady, Duration: d(25)},
		{Name: PhaseSpike, Duration: d(45), Scale: free10},
		{Name: PhaseAfter, Duration: d(40)},
	}
	return []Scenario{
		{Name: "steady", StreamFraction: 0.3, Phases: []Phase{{Name: PhaseSteady, Duration: d(40)}},
			ScrapeEvery: time.Second, Laws: SteadyLaws},
		{Name: "spike", StreamFraction: 0.3, Phases: spike, ScrapeEvery: 500 * time.Millisecond, Laws: SpikeLaws},
		{Name: "outage", StreamFraction: 0.3, ScrapeEvery: 100 * time.Millisecond, Laws: OutageLaws, Phases: []Phase{
			{Name: PhaseSteady, Duration: d(10), Scale: low},
			{Name: PhaseOutage, Duration: d(30), Scale: low, Enter: func(e *Env) {
				e.Upstream.SetMode(UpstreamMode{Kind: UpstreamFail, FailFraction: 1, FailStatus: 500})
			}},
			{Name: PhaseRecover, Duration: d(25), Scale: low, Enter: func(e *Env) {
				e.Upstream.SetMode(UpstreamMode{Kind: UpstreamNormal})
			}},
		}},
		{Name: "redis-killed", StreamFraction: 0.3, Hot: true, ScrapeEvery: 250 * time.Millisecond, Laws: RedisLaws, Phases: []Phase{
			{Name: PhaseSteady, Duration: d(15)},
			{Name: PhaseRedisOff, Duration: d(20), Enter: func(e *Env) { e.Cluster.Redis.Kill() }},
			{Name: PhaseRedisOn, Duration: d(15), Enter: func(e *Env) { e.Cluster.Redis.Restart() }},
		}},
		{Name: "budgets", StreamFraction: 0.5, Budgets: true, ScrapeEvery: time.Second, Laws: BudgetLaws, Phases: []Phase{
			{Name: PhaseSteady, Duration: d(40)},
			// No arrivals: every answer and its settlement lands before
			// spend is read.
			{Name: "drain", Duration: 5 * time.Second, Scale: map[string]float64{"premium": 0, "standard": 0, "free": 0}},
		}},
		{Name: "spike-no-shedding", NoShedding: true, Comparison: true, StreamFraction: 0.3, Phases: spike,
			ScrapeEvery: 500 * time.Millisecond, Laws: SpikeLaws},
		// Issue 16: the free spike against a contended shared model
		// limit, with the admission queue and the retry budget on
		// (spikequeue.go; fair share behind SpikeQueueFairShare).
		{Name: "spike-queue", StreamFraction: 0.3, Phases: spikeQueuePhases(d), ScrapeEvery: 250 * time.Millisecond,
			Laws: SpikeQueueLaws, Flags: SpikeQueueFlags, Tenants: SpikeQueueTenants,
			Rules: func(shipped string) (string, error) { return SpikeQueueRules(shipped, SpikeQueueFairShare) }},
	}
}

// Traffic is the classes and their tenants by tier.
func Traffic(sc *Scenario) ([]Class, map[string][]Tenant) {
	rs := sc.RateScale
	if rs == 0 {
		rs = 1
	}
	count := func(tier string, n int) int {
		if m, ok := sc.Tenants[tier]; ok {
			return m
		}
		return n
	}
	tenants := map[string][]Tenant{
		"premium":  NewTenants("premium", count("premium", premiumTenants)),
		"standard": NewTenants("standard", count("standard", standardTenants)),
		"free":     NewTenants("free", count("free", freeTenants)),
	}
	mk := func(tier string, rate float64, ts []Tenant) Class {
		return Class{Name: tier, Tier: tier, Tenants: ts, Model: Model, Rate: rate * rs, StreamFraction: sc.StreamFraction,
			PromptTokens: Range{Min: 50, Max: 150}, MaxTokens: Range{Min: 64, Max: 64}, Timeout: 10 * time.Second}
	}
	classes := []Class{
		mk("premium", PremiumRate, tenants["premium"]),
		mk("standard", StandardRate, tenants["standard"]),
		mk("free", FreeRate, tenants["free"]),
	}
	if sc.Hot {
		hot := NewTenants("hot", 1)
		tenants["free"] = append(tenants["free"], hot...)
		c := mk("free", hotRate, hot)
		c.Name = "hot"
		classes = append(classes, c)
	}
	return classes, tenants
}

// RunScenario runs sc on b: Redis, the replicas, the upstream, the
// gateway, the driver through every phase, the recorder; then writes the
// CSV and plots into b.Out and returns the laws (with Scenario set) and
// the run.
func RunScenario(t testing.TB, b Bench, sc Scenario) ([]Law, *Run) {
	t.Helper()
	rulesPath := ShippedRules()
	if sc.NoShedding || sc.Rules != nil {
		data, err := os.ReadFile(rulesPath)
		if err != nil {
			t.Fatal(err)
		}
		rules := string(data)
		if sc.NoShedding {
			rules = RulesWithout(rules, "shedding", "control")
		}
		if sc.Rules != nil {
			if rules, err = sc.Rules(rules); err != nil {
				t.Fatal(err)
			}
		}
		rulesPath = filepath.Join(t.TempDir(), "inference-"+sc.Name+".yaml")
		if err := os.WriteFile(rulesPath, []byte(rules), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	classes, tenants := Traffic(&sc)
	cluster := StartCluster(t, b.Bin, max(b.Replicas, 1), rulesPath, tenants, sc.Flags...)
	up := b.NewUpstream(IssueUpstream)
	base, err := up.Start()
	if err != nil {
		t.Fatalf("start upstream: %v", err)
	}
	t.Cleanup(up.Close)
	ctx := t.Context()
	gw, err := b.NewGateway(ctx, GatewayConfig{Replicas: cluster.GRPCAddrs(), Upstream: base, Mode: b.Mode, Instances: 2})
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	rec := NewRecorder()
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		rec.Sample(sctx, sc.ScrapeEvery, up.Stats, cluster.AdminAddrs())
	}()
	drv := NewDriver(gw, rec, classes, 13, max(b.MaxInFlight, 1))
	dctx, stopDriving := context.WithCancel(ctx)
	driven := make(chan struct{})
	go func() {
		defer close(driven)
		drv.Run(dctx)
	}()
	env := &Env{T: t, Upstream: up, Cluster: cluster}
	for _, ph := range sc.Phases {
		drv.SetScale(ph.Scale)
		rec.Mark(ph.Name)
		if ph.Enter != nil {
			ph.Enter(env)
		}
		select {
		case <-time.After(ph.Duration):
		case <-ctx.Done():
		}
	}
	rec.Mark("end")
	stopDriving()
	<-driven // bounded: each request gives up at its class's Timeout
	stopSampling()
	<-sampled
	if err := gw.Close(); err != nil {
		t.Errorf("close gateway: %v", err)
	}
	run := rec.Finish()
	params := LawParams{Warmup: sc.Warmup}
	if params.Warmup == 0 {
		params.Warmup = 5 * time.Second
	}
	if sc.Hot {
		params.HotTenant, params.HotLimit = "hot-0", hotLimit
	}
	if sc.Budgets {
		params.Usage = up.Stats().Usage
		if b.Spend != nil {
			params.Spend = map[string]int64{}
			// Every tenant that sent a request, not only those the
			// upstream billed: a charge never settled shows as spend
			// against no usage.
			for _, tenant := range SpendTenants(run, params.Usage) {
				s, err := b.Spend(ctx, cluster, tenant)
				if err != nil {
					t.Errorf("read %s's spend: %v", tenant, err)
					continue
				}
				params.Spend[tenant] = s
			}
		}
	}
	laws := sc.Laws(run, params)
	for i := range laws {
		laws[i].Scenario = sc.Name
	}
	if b.Out != "" {
		if _, err := WriteFiles(b.Out, sc.Name, run); err != nil {
			t.Errorf("write %s output: %v", sc.Name, err)
		}
	}
	return laws, run
}

// Summary is one line per tier of a run's phases: mean goodput a second
// and goodput p99, for logs and reports.
func Summary(run *Run) string {
	var out string
	for i, ph := range run.Phases {
		if ph.Name == "end" {
			continue
		}
		from, to := ph.At, run.End
		if i+1 < len(run.Phases) {
			to = run.Phases[i+1].At
		}
		out += fmt.Sprintf("%s (%.0fs):", ph.Name, to.Sub(from).Seconds())
		for _, t := range run.Tiers {
			out += fmt.Sprintf(" %s %.1f/s p99 %v;", t, goodput(run, t, from, to), p99(run, t, from, to).Round(time.Millisecond))
		}
		out += fmt.Sprintf(" upstream overloads %.0f\n", overloads(run, from, to))
	}
	return out
}
