package app

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-dev/tollgate/pkg/extauthz"
	"github.com/tollgate-dev/tollgate/pkg/limit"
	"github.com/tollgate-dev/tollgate/pkg/rls"
)

// overloadAnswer answers a call past --max-in-flight at once, without
// deciding: each adapter says how its call is answered (rls follows the
// default store_failure, extauthz always refuses); other calls get
// RESOURCE_EXHAUSTED.
func overloadAnswer(policy limit.StoreFailure) func(ctx context.Context, method string, req any) (any, error) {
	return func(_ context.Context, method string, _ any) (any, error) {
		switch method {
		case rls.ShouldRateLimitMethod:
			return rls.OverloadResponse(policy), nil
		case extauthz.CheckMethod:
			return extauthz.OverloadResponse(), nil
		}
		return nil, status.Error(codes.ResourceExhausted, "tollgate: too many calls in flight on this replica")
	}
}
