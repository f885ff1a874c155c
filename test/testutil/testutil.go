// Package testutil holds the test helpers several packages' tests share:
// the stores a decision test runs against, and a flat view of metrics.
// It is imported only by _test files.
package testutil

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

// StoreKind makes a fresh store for one test.
type StoreKind struct {
	Name string
	Make func(t testing.TB) limit.Store
}

// StoreKinds are the stores every adapter test runs against: the
// in-memory store and a real redis-server started for the test.
var StoreKinds = []StoreKind{
	{"memstore", func(testing.TB) limit.Store { return memstore.New() }},
	{"redis", RedisStore},
}

// RedisStore starts a redis-server for t and returns a store on it,
// closed at cleanup.
func RedisStore(t testing.TB) limit.Store {
	srv := redistest.Start(t)
	c, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	s := redisstore.New(c)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Gather renders every counter as `name{labels}` -> value, and each
// histogram as its `name_count`.
func Gather(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName()
			if len(ls) > 0 {
				name += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
