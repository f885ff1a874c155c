package memstore_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

// Each subtest gets its own store: a write sweeps other scopes by its
// now, and the suites' subtests are days apart.

func TestFlightsConformance(t *testing.T) {
	t.Parallel()
	storetest.RunFlights(t, func(testing.TB) limit.Flights { return memstore.NewFlights() })
}

func TestMetersConformance(t *testing.T) {
	t.Parallel()
	storetest.RunMeters(t, func(testing.TB) limit.Meters { return memstore.NewMeters() })
}

func TestCellsConformance(t *testing.T) {
	t.Parallel()
	storetest.RunCells(t, func(testing.TB) limit.Cells { return memstore.NewCells() })
}
