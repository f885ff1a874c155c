package upstream

import "time"

// Counts counts requests by how they ended. Every request that reached
// the chat endpoint is Received and ends in exactly one of the others,
// once it has ended (InFlight are still going).
type Counts struct {
	Received int64 `json:"received"`
	// Served: 200, the whole response sent.
	Served int64 `json:"served"`
	// QueueFull: 503 at once, the queue was full.
	QueueFull int64 `json:"queue_full"`
	// QueueTimeout: 504, it waited QueueTimeout for a slot.
	QueueTimeout int64 `json:"queue_timeout"`
	// Vendor429: 429 in Vendor429 mode.
	Vendor429 int64 `json:"vendor_429"`
	// Failed: the 5xx of Fail mode.
	Failed int64 `json:"failed"`
	// Cancelled: the client went away first, queued or in service.
	Cancelled int64 `json:"cancelled"`
	// BadRequest: 4xx for a malformed request (not JSON, bad max_tokens,
	// too large, wrong method).
	BadRequest int64 `json:"bad_request"`
}

// Overloads is how many answers said the upstream was overloaded: 503
// queue full and 504 queue timeout.
func (c Counts) Overloads() int64 { return c.QueueFull + c.QueueTimeout }

// Second is one wall-clock second (Unix): Received counts the requests
// that arrived in it, the other counts those that ended in it. InFlight
// and Queued are the gauges as the second ended (or now, for the current
// one), MaxInFlight and MaxQueued the most they were in it.
type Second struct {
	Unix int64 `json:"unix"`
	Counts
	InFlight    int `json:"in_flight"`
	Queued      int `json:"queued"`
	MaxInFlight int `json:"max_in_flight"`
	MaxQueued   int `json:"max_queued"`
}

// Usage is one tenant's (x-sim-tenant's) real usage: the tokens of the
// responses served, and of the requests cancelled in service (their
// prompt, and the completion tokens already streamed), as a vendor would
// bill them.
type Usage struct {
	Served           int64 `json:"served"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	// Cancelled counts the tenant's cancelled requests, queued or in
	// service; CancelledPromptTokens and CancelledCompletionTokens, those
	// in service only.
	Cancelled                 int64 `json:"cancelled"`
	CancelledPromptTokens     int64 `json:"cancelled_prompt_tokens"`
	CancelledCompletionTokens int64 `json:"cancelled_completion_tokens"`
}

// TotalTokens is the tokens served: prompt plus completion.
func (u Usage) TotalTokens() int64 { return u.PromptTokens + u.CompletionTokens }

// Stats is a snapshot of the upstream.
type Stats struct {
	Time     time.Time `json:"time"`
	Mode     Mode      `json:"mode"`
	Slots    int       `json:"slots"`
	QueueCap int       `json:"queue_cap"`
	// Busy is the slots taken, Queued the requests waiting for one, and
	// InFlight their sum: the upstream's load.
	Busy     int `json:"busy"`
	Queued   int `json:"queued"`
	InFlight int `json:"in_flight"`
	// Totals counts every request since New; ByMode, by the mode it
	// arrived in (keys: normal, fail, vendor429).
	Totals Counts            `json:"totals"`
	ByMode map[string]Counts `json:"by_mode"`
	// Tenants is the usage by x-sim-tenant (NoTenant without one).
	Tenants map[string]Usage `json:"tenants"`
	// Seconds are the last Config.History seconds since New, oldest
	// first, the current (partial) second last.
	Seconds []Second `json:"seconds"`
}

const (
	// NoTenant is the Stats.Tenants key of requests without x-sim-tenant.
	NoTenant = "-"
	// OtherTenant is where the tenants past Config.MaxTenants, or with a
	// name too long or not printable ASCII, are accounted.
	OtherTenant = "(other)"
	// maxTenantLen bounds an accounted tenant name.
	maxTenantLen = 128
)

// outcome is how a request ended; each picks one field of Counts.
type outcome int

const (
	outServed outcome = iota
	outQueueFull
	outQueueTimeout
	outVendor429
	outFailed
	outCancelled
	outBadRequest
)

func (c *Counts) add(o outcome) {
	switch o {
	case outServed:
		c.Served++
	case outQueueFull:
		c.QueueFull++
	case outQueueTimeout:
		c.QueueTimeout++
	case outVendor429:
		c.Vendor429++
	case outFailed:
		c.Failed++
	case outCancelled:
		c.Cancelled++
	case outBadRequest:
		c.BadRequest++
	}
}

// history is a ring of per-second counters; the Upstream's mutex guards
// it.
type history struct {
	ring []Second
	// first is the Unix second New was called in: seconds before it are
	// not reported.
	first int64
	// inFlight and queued are the gauges last observed, which a new
	// second starts from.
	inFlight, queued int
}

func newHistory(n int, now time.Time) history {
	return history{ring: make([]Second, n), first: now.Unix()}
}

// at is the counters of now's second, cleared when the ring comes round
// to it again.
func (h *history) at(now time.Time) *Second {
	u := now.Unix()
	s := &h.ring[int(u%int64(len(h.ring)))]
	if s.Unix != u {
		*s = Second{Unix: u, InFlight: h.inFlight, Queued: h.queued, MaxInFlight: h.inFlight, MaxQueued: h.queued}
	}
	return s
}

// observe records the gauges now.
func (h *history) observe(now time.Time, inFlight, queued int) {
	s := h.at(now) // a new second starts from the gauges before this change
	h.inFlight, h.queued = inFlight, queued
	s.InFlight, s.Queued = inFlight, queued
	s.MaxInFlight = max(s.MaxInFlight, inFlight)
	s.MaxQueued = max(s.MaxQueued, queued)
}

// snapshot lists the seconds from the oldest kept to now's. A second
// without an event carries the gauges of the second before it.
func (h *history) snapshot(now time.Time) []Second {
	last := now.Unix()
	from := max(h.first, last-int64(len(h.ring))+1)
	out := make([]Second, 0, max(last-from+1, 0))
	var prev Second
	for u := from; u <= last; u++ {
		s := h.ring[int(u%int64(len(h.ring)))]
		if s.Unix != u {
			s = Second{Unix: u, InFlight: prev.InFlight, Queued: prev.Queued, MaxInFlight: prev.InFlight, MaxQueued: prev.Queued}
		}
		out = append(out, s)
		prev = s
	}
	return out
}

// tenantKey is the accounting key of an x-sim-tenant value: hostile input,
// so bounded in length and alphabet.
func tenantKey(v string) string {
	if v == "" {
		return NoTenant
	}
	if len(v) > maxTenantLen {
		return OtherTenant
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return OtherTenant
		}
	}
	return v
}

func cloneCounts(byMode *[numKinds]Counts) map[string]Counts {
	m := make(map[string]Counts, numKinds)
	for k, c := range byMode {
		m[Kind(k).String()] = c
	}
	return m
}

func cloneTenants(t map[string]*Usage) map[string]Usage {
	m := make(map[string]Usage, len(t))
	for k, u := range t {
		m[k] = *u
	}
	return m
}
