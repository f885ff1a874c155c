package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// SharedSecret returns the secret of n random bytes kept under name,
// making it when no replica has yet: every replica on this Redis gets the
// same one. It is the one kind of key Tollgate writes without a TTL: a
// secret that expired would void whatever it signed. Whoever can read
// Redis can read it, and whoever can write Redis can change every count
// anyway, so it adds no one to those trusted.
func (s *Store) SharedSecret(ctx context.Context, name string, n int) ([]byte, error) {
	key := "tg:secret:" + name
	fresh := make([]byte, n)
	_, _ = rand.Read(fresh) // never fails (crypto/rand, Go 1.24+)
	if err := s.c.SetNX(ctx, key, fresh, 0).Err(); err != nil {
		return nil, fmt.Errorf("shared secret %q: %w", name, err)
	}
	b, err := s.c.Get(ctx, key).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, fmt.Errorf("shared secret %q: gone right after it was set", name)
	case err != nil:
		return nil, fmt.Errorf("shared secret %q: %w", name, err)
	case len(b) != n:
		return nil, fmt.Errorf("shared secret %q: %d bytes in Redis, want %d", name, len(b), n)
	}
	return b, nil
}
