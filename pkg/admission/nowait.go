package admission

import "context"

// noWaitKey marks a context whose request must not wait in a queue.
type noWaitKey struct{}

// WithoutQueue returns ctx marked so that a decision asked under it is
// answered at once, as if no domain had a queue: an adapter whose
// caller's timeout leaves no room for a wait (serve's --queue-adapters)
// sends its requests under it.
func WithoutQueue(ctx context.Context) context.Context {
	return context.WithValue(ctx, noWaitKey{}, true)
}

// mayQueue says whether a request asked under ctx may wait.
func mayQueue(ctx context.Context) bool {
	off, _ := ctx.Value(noWaitKey{}).(bool)
	return !off
}
