package app

import (
	"context"
	"flag"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/accesslog"
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
}

// newAuthz loads the authz config, if one is given, and builds the
// services. A config with problems stops the start, as bad rules do.
func newAuthz(f authzFlags, lim *limit.Limiter, loop *outcome.Loop, log *zap.Logger, reg prometheus.Registerer) (*authz, error) {
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
	az := &authz{path: f.config, als: als, usage: usage, loop: loop, log: log}
	if f.config == "" {
		return az, nil
	}
	set, err := extauthz.LoadSettings(f.config)
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
		Help: "Reloads of the authz config and its keys file after a change on disk, by result (success, failure: the previous settings kept serving).",
	}, []string{"result"})
	az.reloads.WithLabelValues("success")
	az.reloads.WithLabelValues("failure")
	if err := reg.Register(az.reloads); err != nil {
		return nil, fmt.Errorf("register authz reload metrics: %w", err)
	}
	return az, nil
}

// loaded logs what settings hold: never a key, only how many.
func (az *authz) loaded(msg string, s *extauthz.Settings) {
	az.log.Info(msg, zap.String("path", az.path), zap.String("domain", s.Domain),
		zap.String("keys_file", s.KeysFile), zap.Int("keys", s.Keys.Len()), zap.Bool("require_api_key", s.RequireAPIKey),
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
	onChange := func(s *extauthz.Settings, err error) {
		if err != nil {
			az.reloads.WithLabelValues("failure").Inc()
			logProblems(az.log, "authz config reload rejected; the previous settings keep serving", err)
			return
		}
		az.check.SetSettings(s)
		az.als.SetUsageHeader(s.UsageHeader)
		az.loop.SetCharsPerToken(s.CharsPerToken)
		az.reloads.WithLabelValues("success").Inc()
		az.loaded("authz config reloaded", s)
	}
	if err := extauthz.Watch(ctx, az.path, onChange); err != nil {
		// Serving the settings loaded at start beats not serving.
		az.log.Error("authz config will not reload", zap.Error(err))
	}
}
