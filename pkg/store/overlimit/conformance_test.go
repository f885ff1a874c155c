package overlimit_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/overlimit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(testing.TB) limit.Store {
		return overlimit.New(memstore.New(), overlimit.Options{})
	})
}

// TestFairConformance: fair-shared decisions pass through the cache.
func TestFairConformance(t *testing.T) {
	t.Parallel()
	storetest.RunFair(t, func(testing.TB) limit.Store {
		return overlimit.New(memstore.New(), overlimit.Options{})
	})
}
