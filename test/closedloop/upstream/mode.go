package upstream

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Kind is what the upstream does with a request before it queues it.
type Kind int

const (
	// Normal serves every request it has room for.
	Normal Kind = iota
	// Fail answers a share of requests (Mode.FailFraction) a 5xx at once,
	// without taking a slot: a vendor outage, broken at any load.
	Fail
	// Vendor429 answers 429 with Retry-After, as OpenAI does, to requests
	// over Mode.Rate; the others are served as in Normal.
	Vendor429
	numKinds
)

var kindNames = [numKinds]string{"normal", "fail", "vendor429"}

// String is the kind's name in Stats and in the /mode endpoint.
func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return fmt.Sprintf("Kind(%d)", int(k))
	}
	return kindNames[k]
}

// MarshalText writes the kind's name.
func (k Kind) MarshalText() ([]byte, error) {
	if k < 0 || k >= numKinds {
		return nil, fmt.Errorf("marshal kind %d: unknown", int(k))
	}
	return []byte(kindNames[k]), nil
}

// UnmarshalText reads a kind's name.
func (k *Kind) UnmarshalText(b []byte) error {
	for i, n := range kindNames {
		if string(b) == n {
			*k = Kind(i)
			return nil
		}
	}
	return fmt.Errorf("unmarshal kind: want normal, fail or vendor429, got %q", truncate(string(b), 32))
}

// Mode is the upstream's behaviour, switched at run time by SetMode or
// PUT /mode.
type Mode struct {
	Kind Kind `json:"kind"`
	// FailFraction is the share of requests Fail answers with FailStatus,
	// spread evenly (0.25: every fourth), in (0, 1]. 0 means 1.
	FailFraction float64 `json:"fail_fraction,omitempty"`
	// FailStatus is the 5xx Fail answers. 0 means 500.
	FailStatus int `json:"fail_status,omitempty"`
	// Rate is the requests per second Vendor429 lets through (more than
	// 0), and Burst how many it lets through at once (0 means
	// max(1, Rate)): a token bucket, as a vendor's per-key limit.
	Rate  float64 `json:"rate,omitempty"`
	Burst float64 `json:"burst,omitempty"`
}

// withDefaults fills the zero fields of a valid mode.
func (m Mode) withDefaults() Mode {
	if m.Kind == Fail {
		if m.FailFraction == 0 {
			m.FailFraction = 1
		}
		if m.FailStatus == 0 {
			m.FailStatus = 500
		}
	}
	if m.Kind == Vendor429 && m.Burst == 0 {
		m.Burst = max(1, m.Rate)
	}
	return m
}

// Validate says what is wrong with m, if anything.
func (m Mode) Validate() error {
	switch m.Kind {
	case Normal:
		return nil
	case Fail:
		if !(m.FailFraction >= 0 && m.FailFraction <= 1) {
			return fmt.Errorf("fail fraction: want 0 to 1, got %v", m.FailFraction)
		}
		if m.FailStatus != 0 && (m.FailStatus < 500 || m.FailStatus > 599) {
			return fmt.Errorf("fail status: want 500 to 599, got %d", m.FailStatus)
		}
		return nil
	case Vendor429:
		if !(m.Rate > 0 && m.Rate <= 1e9) {
			return fmt.Errorf("rate: want more than 0 and at most 1e9, got %v", m.Rate)
		}
		if !(m.Burst >= 0 && m.Burst <= 1e9) {
			return fmt.Errorf("burst: want 0 to 1e9, got %v", m.Burst)
		}
		return nil
	default:
		return errors.New("kind: want normal, fail or vendor429")
	}
}

// modeState is the mode and what it remembers between requests; the
// Upstream's mutex guards it.
type modeState struct {
	Mode
	failAcc float64   // Fail: the fraction owed, failing a request at each whole one
	tokens  float64   // Vendor429: the bucket's tokens at last
	last    time.Time // Vendor429: when tokens was last brought up to date
}

func newModeState(m Mode, now time.Time) modeState {
	m = m.withDefaults()
	return modeState{Mode: m, tokens: m.Burst, last: now}
}

// fail says whether this request gets FailStatus. An accumulator, not a
// random draw, so that a fraction is exact over any run of requests.
func (s *modeState) fail() bool {
	if s.Kind != Fail {
		return false
	}
	s.failAcc += s.FailFraction
	if s.failAcc >= 1-1e-9 {
		s.failAcc = max(s.failAcc-1, 0)
		return true
	}
	return false
}

// limited says whether Vendor429 refuses this request, and when the
// client may try again.
func (s *modeState) limited(now time.Time) (bool, time.Duration) {
	if s.Kind != Vendor429 {
		return false, 0
	}
	if dt := now.Sub(s.last); dt > 0 {
		s.tokens = min(s.Burst, s.tokens+dt.Seconds()*s.Rate)
	}
	s.last = now
	if s.tokens >= 1 {
		s.tokens--
		return false, 0
	}
	wait := time.Duration(math.Ceil((1 - s.tokens) / s.Rate * float64(time.Second)))
	return true, max(wait, time.Millisecond)
}
