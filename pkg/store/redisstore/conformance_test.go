package redisstore

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/storetest"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	s, _ := newSingle(t)
	storetest.Run(t, func(testing.TB) limit.Store { return s })
	storetest.RunFair(t, func(testing.TB) limit.Store { return s })
}

func TestConformanceUnixSocket(t *testing.T) {
	t.Parallel()
	s, _ := newSingle(t, redistest.WithUnixSocket())
	storetest.Run(t, func(testing.TB) limit.Store { return s })
}

func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	s := newCluster(t)
	storetest.Run(t, func(testing.TB) limit.Store { return s })
	storetest.RunFair(t, func(testing.TB) limit.Store { return s })
}

// newCluster starts a 3-master cluster and returns a Store on it, made
// through NewClient as the service makes it.
func newCluster(t testing.TB) *Store {
	t.Helper()
	c := redistest.StartCluster(t, 3)
	client, err := NewClient("redis+cluster://" + strings.Join(c.Addrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	s := New(client)
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	return s
}
