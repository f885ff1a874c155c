package upstream

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config sizes the upstream and times its work. DefaultConfig gives the
// model server issue 13 measures against; tests shrink it.
type Config struct {
	// Slots is how many requests it serves at once (its GPU batch).
	// Default 32.
	Slots int
	// Queue is how many requests wait for a slot, first in first out; one
	// more is answered 503 at once. Default 128.
	Queue int
	// QueueTimeout is how long a request may wait for a slot before it is
	// answered 504. Default 500 ms.
	QueueTimeout time.Duration

	// TTFT is the prefill time of a request with an empty prompt;
	// PerPromptToken adds to it for each prompt token. PerToken is the
	// time of one output token. A request's service time is
	// (TTFT + PerPromptToken*prompt + PerToken*completion) * batch, where
	// batch = 1 + BatchK*busy/Slots and busy counts the slots taken when it
	// got its slot, its own included: a fuller batch serves each of its
	// requests more slowly, as a GPU does. Defaults 40 ms, 0.2 ms,
	// 3.05 ms and 0.5: see Capacity for the rate they give.
	TTFT           time.Duration
	PerPromptToken time.Duration
	PerToken       time.Duration
	BatchK         float64

	// CharsPerToken turns the characters of the messages' text into prompt
	// tokens, rounding up, as Tollgate's estimate does. Default 4.
	CharsPerToken float64
	// DefaultMaxTokens bounds the completion of a request that sets
	// neither max_tokens nor max_completion_tokens. Default 256,
	// Tollgate's default_max_tokens.
	DefaultMaxTokens int
	// MaxTokensLimit is the largest max_tokens accepted (400 above it), so
	// that no request holds a slot without bound. Default 16384.
	MaxTokensLimit int
	// ChunkTokens is how many tokens one SSE content chunk carries after
	// the first (which carries one token, at the time to first token).
	// Default 8: fewer timers and writes than a chunk a token.
	ChunkTokens int
	// MinCompletion is the shortest completion, as a share of max_tokens
	// in [0, 1]: completions are uniform in [max(1,
	// ceil(MinCompletion*max_tokens)), max_tokens]. Default 0; 1 makes
	// every completion max_tokens long.
	MinCompletion float64
	// Seed seeds the completion lengths. Default 13.
	Seed uint64

	// MaxBodyBytes bounds a request body (413 above it). Default 1 MiB.
	MaxBodyBytes int64
	// History is how many seconds of per-second counters Stats keeps.
	// Default 900.
	History int
	// MaxTenants bounds the tenants accounted one by one; the usage of any
	// further tenant is added under OtherTenant. Default 10000.
	MaxTenants int
}

// DefaultConfig is the upstream of issue 13: 32 slots, a queue of 128,
// 504 after 500 ms of waiting, about 134 requests/s of the default mix
// (MixPromptChars, MixMaxTokens) at saturation.
func DefaultConfig() Config {
	return Config{
		Slots:            32,
		Queue:            128,
		QueueTimeout:     500 * time.Millisecond,
		TTFT:             40 * time.Millisecond,
		PerPromptToken:   200 * time.Microsecond,
		PerToken:         3050 * time.Microsecond,
		BatchK:           0.5,
		CharsPerToken:    4,
		DefaultMaxTokens: 256,
		MaxTokensLimit:   16384,
		ChunkTokens:      8,
		Seed:             13,
		MaxBodyBytes:     1 << 20,
		History:          900,
		MaxTenants:       10000,
	}
}

// Validate says what is wrong with c, if anything.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Slots >= 1, "slots: want at least 1, got %d", c.Slots)
	check(c.Queue >= 0, "queue: want 0 or more, got %d", c.Queue)
	check(c.QueueTimeout > 0, "queue timeout: want more than 0, got %v", c.QueueTimeout)
	check(c.TTFT >= 0 && c.PerPromptToken >= 0 && c.PerToken >= 0,
		"service times: want 0 or more, got ttft %v, per prompt token %v, per token %v", c.TTFT, c.PerPromptToken, c.PerToken)
	check(c.BatchK >= 0 && c.BatchK <= 100, "batch k: want 0 to 100, got %v", c.BatchK)
	check(c.CharsPerToken > 0 && c.CharsPerToken <= 1000, "chars per token: want more than 0 and at most 1000, got %v", c.CharsPerToken)
	check(c.MaxTokensLimit >= 1, "max tokens limit: want at least 1, got %d", c.MaxTokensLimit)
	check(c.DefaultMaxTokens >= 1 && c.DefaultMaxTokens <= c.MaxTokensLimit,
		"default max tokens: want 1 to %d, got %d", c.MaxTokensLimit, c.DefaultMaxTokens)
	check(c.MinCompletion >= 0 && c.MinCompletion <= 1, "min completion: want 0 to 1, got %v", c.MinCompletion)
	check(c.ChunkTokens >= 1, "chunk tokens: want at least 1, got %d", c.ChunkTokens)
	check(c.MaxBodyBytes >= 1, "max body bytes: want at least 1, got %d", c.MaxBodyBytes)
	check(c.History >= 1 && c.History <= 86400, "history: want 1 to 86400 seconds, got %d", c.History)
	check(c.MaxTenants >= 0, "max tenants: want 0 or more, got %d", c.MaxTenants)
	return errors.Join(errs...)
}

// The default request mix, which Capacity and the tests measure: a
// prompt of MixPromptChars characters (100 tokens) and max_tokens
// MixMaxTokens, so completions are uniform in [1, 64], 32.5 tokens on
// average. ChatBody builds such a body.
const (
	MixPromptChars = 400
	MixMaxTokens   = 64
)

// MeanService is the mean service time of a request of promptTokens and
// max_tokens maxTokens that got its slot when busy slots (its own
// included) were taken.
func (c Config) MeanService(promptTokens, maxTokens, busy int) time.Duration {
	meanCompletion := float64(c.minCompletion(maxTokens)+maxTokens) / 2
	base := float64(c.TTFT) + float64(c.PerPromptToken)*float64(promptTokens) + float64(c.PerToken)*meanCompletion
	return time.Duration(base * c.batch(busy))
}

// Capacity is the rate, in requests per second, the upstream serves at
// saturation (every slot busy, a queue waiting) for requests of
// promptTokens and maxTokens: Slots over the mean service time of a full
// batch. DefaultConfig's is 134.07/s for the default mix; the capacity
// test measures it.
func (c Config) Capacity(promptTokens, maxTokens int) float64 {
	return float64(c.Slots) / c.MeanService(promptTokens, maxTokens, c.Slots).Seconds()
}

func (c Config) batch(busy int) float64 {
	return 1 + c.BatchK*float64(busy)/float64(c.Slots)
}

// minCompletion is the fewest completion tokens of a request of
// maxTokens.
func (c Config) minCompletion(maxTokens int) int {
	return min(max(1, int(math.Ceil(c.MinCompletion*float64(maxTokens)))), maxTokens)
}
