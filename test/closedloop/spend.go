package closedloop

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// spendScript sums a sliding window counter's buckets: the stored value
// is cmsgpack {width, high, bucket...} (pkg/store/redisstore/apply.lua's
// loadWindow); an absent key is 0 spent.
var spendScript = redis.NewScript(`
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local c = cmsgpack.unpack(raw)
local s = 0
for i = 3, #c do s = s + c[i] end
return s
`)

// RedisSpend reads tenant's settled gpt-4o token spend from Redis: the
// buckets of config/inference.yaml's tenant_gpt4o_tokens counter (a
// sliding hour, so a run's whole spend is in it). Leases (spent locally,
// returned within --lease-max-life, 1s by default) are settled by the
// time a scenario's drain phase ends.
func RedisSpend(ctx context.Context, c *Cluster, tenant string) (int64, error) {
	key := limit.Key(limit.Tokens, limit.SlidingWindow, time.Hour, "inference",
		[]limit.Entry{{Key: "tenant", Value: tenant}, {Key: "model", Value: Model}})
	n, err := spendScript.Run(ctx, c.Client, []string{key}).Int64()
	if err != nil {
		return 0, fmt.Errorf("read spend of %s: %w", tenant, err)
	}
	return n, nil
}
