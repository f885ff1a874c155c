package memstore_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
)

func TestBoardConformance(t *testing.T) {
	t.Parallel()
	storetest.RunBoard(t, func(testing.TB) limit.Board { return memstore.NewBoard() })
}
