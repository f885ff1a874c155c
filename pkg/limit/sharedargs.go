package limit

import (
	"time"
)

// Caps on the arguments of Flights, Meters and Cells. Request IDs come
// from Envoy's x-request-id, which a client may set, and scopes hold model
// names read from request bodies, so past these caps a call is invalid
// (ErrInvalid) rather than expensive. Every store checks its arguments
// with the functions below, so they all reject the same calls alike.
const (
	// MaxFlightIDBytes caps a flight's request ID; an x-request-id is a
	// UUID (36 bytes).
	MaxFlightIDBytes = 128
	// MaxFlightIDs caps the IDs of one Begin or End: a store sends them in
	// one script call.
	MaxFlightIDs = 1024
	// MaxScopeBytes caps a scope of Flights or Meters and a key of Cells.
	MaxScopeBytes = 128
	// MaxMeterNameBytes caps a Meters count name.
	MaxMeterNameBytes = 64
	// MaxMeterNames caps the names of one Add.
	MaxMeterNames = 64
	// MaxMeterBuckets caps the whole buckets one Sum reads.
	MaxMeterBuckets = 1024
	// MaxCellBytes caps a Cells value.
	MaxCellBytes = 4096
)

// CheckScope checks a Flights or Meters scope, or a Cells key (what says
// which in errors).
func CheckScope(what, scope string) error {
	switch {
	case scope == "":
		return Invalidf("%s: empty", what)
	case len(scope) > MaxScopeBytes:
		return Invalidf("%s: %d bytes, at most %d", what, len(scope), MaxScopeBytes)
	}
	return nil
}

// ExpiryMs returns the Unix ms at which something written at now and
// live for d expires: now in ms plus d rounded up to whole milliseconds,
// as BoardExpiry counts. d must be at least a millisecond.
func ExpiryMs(what string, now time.Time, d time.Duration) (int64, error) {
	if d < time.Millisecond {
		return 0, Invalidf("%s: %v is under 1ms", what, d)
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return now.UnixMilli() + int64(ms), nil
}

// CheckFlights checks the arguments of a Flights Begin (begin: with a
// lease) or End, and returns the lease's expiry in Unix ms for Begin.
func CheckFlights(now time.Time, scope string, ids []string, lease time.Duration, begin bool) (int64, error) {
	if err := CheckScope("flights scope", scope); err != nil {
		return 0, err
	}
	if len(ids) > MaxFlightIDs {
		return 0, Invalidf("flights scope %q: %d IDs, at most %d", scope, len(ids), MaxFlightIDs)
	}
	for i, id := range ids {
		switch {
		case id == "":
			return 0, Invalidf("flights scope %q: ids[%d] is empty", scope, i)
		case len(id) > MaxFlightIDBytes:
			return 0, Invalidf("flights scope %q: ids[%d] is %d bytes, at most %d", scope, i, len(id), MaxFlightIDBytes)
		}
	}
	if !begin {
		return 0, nil
	}
	return ExpiryMs("flights lease", now, lease)
}

// CheckScopes checks the scopes of a Flights Count.
func CheckScopes(scopes []string) error {
	for _, s := range scopes {
		if err := CheckScope("flights scope", s); err != nil {
			return err
		}
	}
	return nil
}

// BucketMs checks a Meters bucket width (a whole number of milliseconds,
// at least one) and returns it in ms.
func BucketMs(bucket time.Duration) (int64, error) {
	if bucket < time.Millisecond || bucket%time.Millisecond != 0 {
		return 0, Invalidf("meters bucket %v is not a whole number of milliseconds", bucket)
	}
	return bucket.Milliseconds(), nil
}

// CheckMeterAdd checks the arguments of a Meters Add and returns the
// bucket width, the start of the bucket holding now and the Unix ms from
// which that bucket may be dropped (its end plus keep, keep rounded up to
// whole milliseconds), all in ms.
func CheckMeterAdd(now time.Time, scope string, bucket, keep time.Duration, counts map[string]int64) (width, start, until int64, err error) {
	if err := CheckScope("meters scope", scope); err != nil {
		return 0, 0, 0, err
	}
	if width, err = BucketMs(bucket); err != nil {
		return 0, 0, 0, err
	}
	if keep < 0 {
		return 0, 0, 0, Invalidf("meters keep %v is negative", keep)
	}
	if len(counts) > MaxMeterNames {
		return 0, 0, 0, Invalidf("meters scope %q: %d names, at most %d", scope, len(counts), MaxMeterNames)
	}
	for name, n := range counts {
		switch {
		case name == "":
			return 0, 0, 0, Invalidf("meters scope %q: empty name", scope)
		case len(name) > MaxMeterNameBytes:
			return 0, 0, 0, Invalidf("meters scope %q: name is %d bytes, at most %d", scope, len(name), MaxMeterNameBytes)
		case n < 0:
			return 0, 0, 0, Invalidf("meters scope %q: name %q: count %d is negative", scope, name, n)
		}
	}
	start = BucketStart(now.UnixMilli(), width)
	keepMs := int64((keep + time.Millisecond - 1) / time.Millisecond)
	return width, start, start + width + keepMs, nil
}

// CheckMeterSum checks the arguments of a Meters Sum and returns the
// bucket width in ms.
func CheckMeterSum(scope string, bucket time.Duration, n int) (int64, error) {
	if err := CheckScope("meters scope", scope); err != nil {
		return 0, err
	}
	if n < 0 || n > MaxMeterBuckets {
		return 0, Invalidf("meters scope %q: %d buckets, want 0 to %d", scope, n, MaxMeterBuckets)
	}
	return BucketMs(bucket)
}

// BucketStart returns the start (Unix ms) of the width-ms bucket, aligned
// to the Unix epoch, that holds ms.
func BucketStart(ms, width int64) int64 {
	s := ms - ms%width
	if ms < 0 && ms%width != 0 {
		s -= width
	}
	return s
}

// CheckCellSwap checks the arguments of a Cells Swap and returns the
// expiry in Unix ms.
func CheckCellSwap(now time.Time, key string, value []byte, ttl time.Duration) (int64, error) {
	if err := CheckScope("cell key", key); err != nil {
		return 0, err
	}
	if len(value) > MaxCellBytes {
		return 0, Invalidf("cell %q: value is %d bytes, at most %d", key, len(value), MaxCellBytes)
	}
	return ExpiryMs("cell ttl", now, ttl)
}
