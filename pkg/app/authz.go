package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/accesslog"
	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/extproc"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/outcome"
	"github.com/tollgate-dev/tollgate/pkg/server"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// authzFlags are serve's ext_authz settings.
type authzFlags struct {
	config string
	// strict is serve's --strict: the settings' warnings are refused.
	strict bool
}

func (f *authzFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "authz-config", "", "ext_authz settings file (domain, keys_file, descriptors, estimate), reloaded on change with its keys file; empty serves no ext_authz Check")
}

// authz is ext_authz Check and the outcome channels, the access log and
// ext_proc, over the limiter the rate limit service uses. The outcome
// channels are always served: an admitted ShouldRateLimit's ticket comes
// back through the access log too. Check is served only with
// --authz-config.
type authz struct {
	path    string
	check   *extauthz.Service // nil without --authz-config
	als     *accesslog.Service
	usage   *extproc.Service
	loop    *outcome.Loop
	log     *zap.Logger
	reloads *prometheus.CounterVec
	// skipped is the count of keys file entries the settings in force
	// left out.
	skipped prometheus.Gauge
	// now stamps the reload state /readyz shows.
	now   func() time.Time
	state reloadState
	// rules are the rules in force, which the settings are checked
	// against (extauthz.Settings.Against).
	rules func() *limit.RuleSet
	// strict refuses the settings' warnings (serve --strict).
	strict bool
}

// against checks s against rs: its problems as a config.Errors, and
// under --strict its warnings, as an error; otherwise the warnings are
// logged.
func (az *authz) against(s *extauthz.Settings, rs *limit.RuleSet) error {
	problems, warnings := s.Against(rs)
	if len(problems) > 0 {
		return problems
	}
	if err := strictly(az.strict, warnings); err != nil {
		return err
	}
	for _, w := range warnings {
		az.log.Warn("authz: "+w, zap.String("kind", "authz_warning"))
	}
	return nil
}

// rulesProblems is what a rules reload to rs would break in the authz
// settings in force, nil without --authz-config: against, so that
// --strict refuses the warnings the new rules would give the settings
// too. serve keeps the old rules rather than serve both files
// inconsistent.
func (az *authz) rulesProblems(rs *limit.RuleSet) error {
	if az == nil || az.check == nil {
		return nil
	}
	return az.against(az.check.Settings(), rs)
}

// reloadState is what /readyz says of the authz settings in force and of
// the last reload.
type reloadState struct {
	mu sync.Mutex
	// keys and skipped are the settings in force: the keys accepted and
	// the entries of the keys file left out; since is when they came.
	keys, skipped int
	since         time.Time
	// firstSkipped is where the first entry left out is, file:line.
	firstSkipped string
	// failedAt is when the last reload failed, zero when the last one did
	// not; failure says why, without a value of either file.
	failedAt time.Time
	failure  string
}

// newAuthz loads the authz config, if one is given, and builds the
// services. A config with problems stops the start, as bad rules do.
func newAuthz(f authzFlags, lim extauthz.Decider, loop *outcome.Loop, log *zap.Logger, reg prometheus.Registerer) (*authz, error) {
	als, err := accesslog.New(loop, log.Named("accesslog"), reg, accesslog.Options{})
	if err != nil {
		return nil, err
	}
	usage, err := extproc.New(usageSettler{loop}, log.Named("extproc"), reg, extproc.Options{
		Namespace: ticket.MetadataNamespace, TicketField: ticket.Field,
	})
	if err != nil {
		return nil, err
	}
	az := &authz{path: f.config, als: als, usage: usage, loop: loop, log: log, now: time.Now, rules: lim.Rules, strict: f.strict}
	if f.config == "" {
		return az, nil
	}
	set, err := extauthz.LoadSettings(f.config)
	if err == nil {
		err = az.against(set, lim.Rules())
	}
	if err != nil {
		logProblems(log, "authz config", err)
		return nil, fmt.Errorf("load authz config %q: the problems above must be fixed", f.config)
	}
	az.loaded("authz config loaded", set)
	if az.check, err = extauthz.New(lim, set, log.Named("extauthz"), reg); err != nil {
		return nil, err
	}
	az.check.SetSealer(loop.Sealer())
	als.SetUsageHeader(set.UsageHeader)
	loop.SetCharsPerToken(set.CharsPerToken)
	az.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_authz_config_reloads_total",
		Help: "Reloads of the authz config and its keys file after a change on disk, by result (success; partial: applied without the keys file entries that have problems; failure: the previous settings kept serving).",
	}, []string{"result"})
	for _, r := range []string{"success", "partial", "failure"} {
		az.reloads.WithLabelValues(r)
	}
	az.skipped = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tollgate_authz_keys_skipped_entries",
		Help: "Entries of the keys file in force left out for their problems by its last reload; the keys they list are refused. Always 0 after a start, which refuses such a file.",
	})
	for _, c := range []prometheus.Collector{az.reloads, az.skipped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register authz reload metrics: %w", err)
		}
	}
	az.inForce(set)
	return az, nil
}

// inForce records the settings now serving, for /readyz.
func (az *authz) inForce(s *extauthz.Settings) {
	first := ""
	if err := s.Keys.Problems(); err != nil {
		first = where(err)
	}
	az.skipped.Set(float64(s.Keys.Skipped()))
	az.state.mu.Lock()
	defer az.state.mu.Unlock()
	az.state.keys, az.state.skipped, az.state.firstSkipped = s.Keys.Len(), s.Keys.Skipped(), first
	az.state.since, az.state.failedAt, az.state.failure = az.now(), time.Time{}, ""
}

// failed records a reload that kept the settings in force, for /readyz.
func (az *authz) failed(err error) {
	az.state.mu.Lock()
	defer az.state.mu.Unlock()
	az.state.failedAt, az.state.failure = az.now(), where(err)
}

// where says where err's problems are, and how many, without their text:
// a message may quote a value of the file, which /readyz must not show.
// An error that is not a config.Errors is an I/O error, which names only
// the file.
func where(err error) string {
	var problems config.Errors
	if !errors.As(err, &problems) || len(problems) == 0 {
		return oneLine(err.Error())
	}
	p := problems[0]
	at := p.File
	if p.Line > 0 {
		at = fmt.Sprintf("%s:%d", p.File, p.Line)
	}
	if len(problems) == 1 {
		return "1 problem, at " + at
	}
	return fmt.Sprintf("%d problems, the first at %s", len(problems), at)
}

// joinLines joins the non-empty parts, one a line.
func joinLines(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "\n")
}

// oneLine keeps a /readyz line one line long.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }

// detail is /readyz's account of the authz settings: the keys in force,
// the entries of the keys file left out, and a failed reload. A reload
// that failed leaves the replica ready: the settings in force still
// answer, and the same file reaches every replica at once, so not-ready
// would take every replica out of service for a file the previous
// settings serve around.
func (az *authz) detail() string {
	if az.check == nil {
		return ""
	}
	az.state.mu.Lock()
	defer az.state.mu.Unlock()
	st := &az.state
	var b strings.Builder
	fmt.Fprintf(&b, "authz keys: %d in force since %s", st.keys, st.since.UTC().Format(time.RFC3339))
	if st.skipped > 0 {
		fmt.Fprintf(&b, "; keys file entries left out, their keys refused: %d (%s, see the log); a restart refuses this file until they are fixed",
			st.skipped, st.firstSkipped)
	}
	if !st.failedAt.IsZero() {
		fmt.Fprintf(&b, "\nauthz reload failed at %s, the settings in force keep serving: %s, see the log",
			st.failedAt.UTC().Format(time.RFC3339), st.failure)
	}
	return b.String()
}

// loaded logs what settings hold: never a key, only how many.
func (az *authz) loaded(msg string, s *extauthz.Settings) {
	az.log.Info(msg, zap.String("path", az.path), zap.String("domain", s.Domain),
		zap.String("keys_file", s.KeysFile), zap.Int("keys", s.Keys.Len()), zap.Int("keys_skipped", s.Keys.Skipped()), zap.Bool("require_api_key", s.RequireAPIKey),
		zap.Stringer("partial_body", s.PartialBody))
	if s.PartialBody == extauthz.PartialEstimate {
		az.log.Warn("estimate.partial_body is estimate: a body cut before its model is admitted without that model's budgets and breakers", zap.String("path", az.path))
	}
}

// services are the APIs to register beside the rate limit service.
func (az *authz) services() []server.Service {
	if az.check == nil {
		return []server.Service{az.als, az.usage}
	}
	return []server.Service{az.check, az.als, az.usage}
}

// usageSettler settles what ext_proc reads of a response through the
// outcome loop: only a ticket that verifies settles anything.
type usageSettler struct{ loop *outcome.Loop }

var _ extproc.Settler = usageSettler{}

func (u usageSettler) Settle(ctx context.Context, str string, got extproc.Usage) {
	t := u.loop.Open(outcome.ChannelExtProc, str)
	if t == nil {
		return
	}
	u.loop.Report(ctx, outcome.ChannelExtProc, t, outcome.Usage{Total: got.Total, Reported: got.Reported, StreamedChars: got.StreamedChars})
}

// watch reloads the authz config and its keys file on change until ctx
// is done; a bad reload keeps the settings in force. It returns at once
// without --authz-config.
func (az *authz) watch(ctx context.Context) {
	if az.check == nil {
		return
	}
	// extauthz.Watch loads the files once as it starts, as config.Watch
	// does, so that a change since newAuthz's load is not missed; that
	// load belongs to the start: applied, neither logged nor counted as
	// a reload.
	started := false
	onChange := func(s *extauthz.Settings, err error) {
		atStart := !started
		started = true
		if err == nil {
			err = az.against(s, az.rules())
		}
		if err != nil {
			az.reloads.WithLabelValues("failure").Inc()
			az.failed(err)
			logProblems(az.log, "authz config reload rejected; the previous settings keep serving", err)
			return
		}
		az.check.SetSettings(s)
		az.als.SetUsageHeader(s.UsageHeader)
		az.loop.SetCharsPerToken(s.CharsPerToken)
		az.inForce(s)
		if atStart && s.Keys.Problems() == nil {
			az.log.Info("watching authz config", zap.String("path", az.path))
			return
		}
		if problems := s.Keys.Problems(); problems != nil {
			az.reloads.WithLabelValues("partial").Inc()
			logProblems(az.log, "keys file entry left out; its key is refused, the rest of the file applies", problems)
		} else {
			az.reloads.WithLabelValues("success").Inc()
		}
		az.loaded("authz config reloaded", s)
	}
	if err := extauthz.Watch(ctx, az.path, onChange); err != nil {
		// Serving the settings loaded at start beats not serving.
		az.log.Error("authz config will not reload", zap.Error(err))
	}
}
