package app

import (
	"context"
	"crypto/sha256"
	"flag"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
)

// ticketFlags are serve's ticket settings.
type ticketFlags struct {
	keyFile string
	// hooks let tests wait for the key file's reloads (nil: none).
	hooks *config.WatchHooks
}

func (f *ticketFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.keyFile, "ticket-key-file", "", "file of the HMAC keys tickets are signed with: one base64 key (32+ bytes) a line, current first, then previous ones still accepted; reloaded on change. Empty: with Redis a key shared through Redis, else a key of this process")
}

// sharedSecreter is a store that can keep a secret all replicas share:
// the Redis store.
type sharedSecreter interface {
	SharedSecret(ctx context.Context, name string, n int) ([]byte, error)
}

// ticketKeyName names the ticket key kept in Redis.
const ticketKeyName = "ticket-key"

// ticketKeys returns the keys tickets start with and, when they can
// change, a function that keeps them current until ctx ends (it returns
// at once otherwise). With a key file, that is the file, reloaded on
// change; a file that stops loading keeps the keys in force. Without
// one, replicas on one Redis share a key kept there; while Redis cannot
// be reached, a key of this process stands in (its tickets settle on
// this replica only) and Redis is tried again until it answers. Without
// Redis, a key of this process is all a single replica needs.
func (f ticketFlags) ticketKeys(ctx context.Context, store any, log *zap.Logger) (*ticket.Keys, func(context.Context, *ticket.Sealer), error) {
	if f.keyFile != "" {
		keys, err := ticket.LoadKeys(f.keyFile)
		if err != nil {
			return nil, nil, err
		}
		log.Info("ticket keys loaded", zap.String("path", f.keyFile), zap.Int("keys", keys.Len()), zap.String("key_id", keys.ID()))
		return keys, func(ctx context.Context, s *ticket.Sealer) { f.watchKeyFile(ctx, s, log) }, nil
	}
	ss, ok := store.(sharedSecreter)
	if !ok {
		keys := ticket.RandomKeys()
		log.Info("ticket keys: a key of this process", zap.String("key_id", keys.ID()))
		return keys, func(context.Context, *ticket.Sealer) {}, nil
	}
	// Asked before the port serves, so that the first tickets already
	// settle on any replica.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	secret, err := ss.SharedSecret(cctx, ticketKeyName, ticketKeyBytes)
	cancel()
	if err == nil {
		keys, err := ticket.NewKeys(secret)
		if err != nil {
			return nil, nil, err
		}
		log.Info("ticket keys: the key shared through Redis", zap.String("key_id", keys.ID()))
		return keys, func(context.Context, *ticket.Sealer) {}, nil
	}
	log.Warn("ticket key: Redis does not answer yet; until it does, this replica's tickets settle here only", zap.Error(err))
	return ticket.RandomKeys(), func(ctx context.Context, s *ticket.Sealer) { sharedKey(ctx, ss, s, log) }, nil
}

// ticketKeyBytes is the size of the key kept in Redis.
const ticketKeyBytes = 32

// sharedKey fetches the key replicas share through Redis, retrying until
// it comes or ctx ends, and swaps it in, keeping the stand-in key as a
// previous one so the tickets sealed with it still open here.
func sharedKey(ctx context.Context, ss sharedSecreter, s *ticket.Sealer, log *zap.Logger) {
	wait := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		secret, err := ss.SharedSecret(cctx, ticketKeyName, ticketKeyBytes)
		cancel()
		if err == nil {
			keys, err := s.Keys().Rotate(secret)
			if err == nil {
				s.SetKeys(keys)
				log.Info("ticket keys: the key shared through Redis", zap.String("key_id", keys.ID()))
				return
			}
			log.Error("ticket key kept in Redis is unusable; tickets settle on this replica only (set --ticket-key-file)", zap.Error(err))
			return
		}
	}
}

// watchKeyFile reloads the key file on change until ctx ends.
func (f ticketFlags) watchKeyFile(ctx context.Context, s *ticket.Sealer, log *zap.Logger) {
	load := func() (*ticket.Keys, [32]byte, []string, error) {
		data, err := os.ReadFile(f.keyFile)
		if err != nil {
			return nil, [32]byte{}, nil, err
		}
		keys, err := ticket.ParseKeys(f.keyFile, data)
		// The fingerprint is of the bytes: the same file read twice is
		// no change. It never leaves this function.
		return keys, sha256.Sum256(data), nil, err
	}
	onChange := func(keys *ticket.Keys, err error) {
		if err != nil {
			log.Error("ticket keys reload rejected; the keys in force stay", zap.Error(err))
			return
		}
		if keys.Equal(s.Keys()) {
			return // the load at the start of the watch, or a rewrite of the same keys
		}
		s.SetKeys(keys)
		log.Info("ticket keys reloaded", zap.String("path", f.keyFile), zap.Int("keys", keys.Len()), zap.String("key_id", keys.ID()))
	}
	dir := filepath.Dir(filepath.Clean(f.keyFile))
	var h config.WatchHooks
	if f.hooks != nil {
		h = *f.hooks
	}
	if err := config.WatchFilesWithHooks(ctx, []string{dir}, load, onChange, h); err != nil {
		log.Error("ticket keys will not reload", zap.Error(err))
	}
}
