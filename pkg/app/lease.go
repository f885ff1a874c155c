package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/lease"
)

// leaseFlags are serve's settings for spending slices of high limits
// locally (pkg/store/lease). They apply to the Redis store only: the
// in-memory store is local already.
type leaseFlags struct {
	minLimit uint64
	fraction float64
	maxLife  time.Duration
}

func (l *leaseFlags) register(fs *flag.FlagSet) {
	fs.Uint64Var(&l.minLimit, "lease-min-limit", lease.DefaultMinAmount, "smallest window limit whose room a replica leases in slices and spends locally, with no Redis call per decision; smaller limits ask Redis every time")
	fs.Float64Var(&l.fraction, "lease-fraction", lease.DefaultFraction, "the most of a limit's remaining room one lease takes, in [0,1]; 0 turns leases off")
	fs.DurationVar(&l.maxLife, "lease-max-life", lease.DefaultMaxLife, "how long a lease is spent at most before its rest goes back (it also ends before its window bucket does)")
}

func (l *leaseFlags) check() error {
	switch {
	case l.fraction < 0 || l.fraction > 1:
		return errors.New("--lease-fraction must be in [0,1]")
	case l.maxLife <= 0:
		return errors.New("--lease-max-life must be positive")
	}
	return nil
}

// wrap returns inner behind leases, and stop, which gives every lease's
// rest back to inner and must be called before inner closes. With leases
// off it returns inner and a no-op.
func (l *leaseFlags) wrap(ctx context.Context, inner limit.Store, log *zap.Logger) (*lease.Store, limit.Store, func()) {
	if l.fraction == 0 {
		return nil, inner, func() {}
	}
	s := lease.New(inner, lease.Options{MinAmount: max(1, l.minLimit), Fraction: l.fraction, MaxLife: l.maxLife})
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	return s, s, func() {
		cancel()
		<-done
		st := s.Stats()
		log.Info("leases ended", zap.Uint64("local_decisions", st.Local), zap.Uint64("grants", st.Granted),
			zap.Uint64("granted_units", st.GrantedUnits), zap.Uint64("returned_units", st.Returned),
			zap.Uint64("dropped_units", st.Dropped), zap.Uint64("retries", st.Retries))
	}
}

// registerLeaseMetrics exports s's counters.
func registerLeaseMetrics(reg prometheus.Registerer, s *lease.Store) error {
	for _, m := range []struct {
		name, help string
		read       func(lease.Stats) uint64
	}{
		{"tollgate_store_lease_decisions_total", "Decisions admitted from a lease, with no store call.", func(st lease.Stats) uint64 { return st.Local }},
		{"tollgate_store_lease_grants_total", "Leases granted by the store.", func(st lease.Stats) uint64 { return st.Granted }},
		{"tollgate_store_lease_granted_units_total", "Units (requests or tokens) leased from the store.", func(st lease.Stats) uint64 { return st.GrantedUnits }},
		{"tollgate_store_lease_returned_units_total", "Leased units given back to the store unused.", func(st lease.Stats) uint64 { return st.Returned }},
		{"tollgate_store_lease_dropped_units_total", "Leased units left unused that could not be given back in time; they stay spent until their bucket leaves the window.", func(st lease.Stats) uint64 { return st.Dropped }},
		{"tollgate_store_lease_retries_total", "Decisions asked again without a lease because the lease did not fit.", func(st lease.Stats) uint64 { return st.Retries }},
	} {
		read := m.read
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.name, Help: m.help},
			func() float64 { return float64(read(s.Stats())) })); err != nil {
			return fmt.Errorf("register lease metrics: %w", err)
		}
	}
	return nil
}
