package closedloop

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Tenant is one simulated customer: its name and the API key it sends.
type Tenant struct {
	Name, Key string
}

// Range is a uniform integer distribution over [Min, Max].
type Range struct {
	Min, Max int
}

func (r Range) draw(rng *rand.Rand) int {
	if r.Max <= r.Min {
		return r.Min
	}
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

// Class is one kind of client traffic: a tier's tenants calling a model.
type Class struct {
	// Name labels the class in Scale maps; Tier labels its rows.
	Name, Tier string
	// Tenants share the class's rate evenly (each request picks one at
	// random); Tollgate's per-tenant limits see Rate/len(Tenants) each.
	Tenants []Tenant
	Model   string
	// Rate is the class's mean arrival rate, requests/s, before a
	// phase's Scale.
	Rate float64
	// StreamFraction of requests ask for SSE with include_usage.
	StreamFraction float64
	// PromptTokens and MaxTokens are drawn per request; the prompt is
	// about 4 characters per token, as Tollgate's estimate assumes.
	PromptTokens, MaxTokens Range
	// Timeout is the client's: it gives up and cancels after it.
	Timeout time.Duration
}

// Record is one request as the recorder keeps it.
type Record struct {
	Sent                time.Time
	Class, Tier, Tenant string
	Stream              bool
	// Estimate is the prompt's tokens plus max_tokens: what a budget
	// reserves for it before the answer.
	Estimate int64
	// Dropped: the driver's in-flight bound was full and the request was
	// never sent (a client-side drop); Result is empty then.
	Dropped bool
	Result
}

// Sink receives every Record; it is called from many goroutines.
type Sink interface {
	Add(Record)
}

// Driver sends open-loop Poisson arrivals per class through a Gateway:
// arrivals do not wait for answers, as real clients do not, so an
// overloaded system sees the load grow rather than slow down. At most
// MaxInFlight requests are outstanding; an arrival beyond is a drop.
type Driver struct {
	gw          Gateway
	sink        Sink
	classes     []Class
	seed        uint64
	maxInFlight int64

	inFlight atomic.Int64
	scale    []atomic.Uint64 // per class, math.Float64bits of its multiplier
	wake     []chan struct{} // per class: its scale changed
	wg       sync.WaitGroup
}

// NewDriver returns a driver of classes through gw into sink, with every
// class at scale 1. seed makes the arrival times and request shapes
// reproducible (answers are not).
func NewDriver(gw Gateway, sink Sink, classes []Class, seed uint64, maxInFlight int) *Driver {
	d := &Driver{gw: gw, sink: sink, classes: classes, seed: seed, maxInFlight: int64(max(maxInFlight, 1)),
		scale: make([]atomic.Uint64, len(classes)), wake: make([]chan struct{}, len(classes))}
	for i := range classes {
		d.scale[i].Store(f64bits(1))
		d.wake[i] = make(chan struct{}, 1)
	}
	return d
}

// SetScale sets each named class's rate multiplier; classes not named go
// back to 1. A Poisson process is memoryless, so the next arrival is
// drawn afresh at the new rate.
func (d *Driver) SetScale(scale map[string]float64) {
	for i, c := range d.classes {
		s, ok := scale[c.Name]
		if !ok {
			s = 1
		}
		d.scale[i].Store(f64bits(max(s, 0)))
		select {
		case d.wake[i] <- struct{}{}:
		default:
		}
	}
}

// Run sends arrivals until ctx ends, then waits for every request it sent
// to be answered or to give up (each is bounded by its class's Timeout).
func (d *Driver) Run(ctx context.Context) {
	for i := range d.classes {
		d.wg.Go(func() { d.arrivals(ctx, i) })
	}
	<-ctx.Done()
	d.wg.Wait()
}

// arrivals is class i's arrival process. Arrival times are absolute
// (next = previous + Exp/rate), so a late timer does not lower the rate:
// the arrivals it missed are sent at once.
func (d *Driver) arrivals(ctx context.Context, i int) {
	c := &d.classes[i]
	rng := rand.New(rand.NewPCG(d.seed, uint64(i)+1))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	next := time.Now()
	for {
		rate := c.Rate * f64from(d.scale[i].Load())
		if rate <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-d.wake[i]:
				next = time.Now()
				continue
			}
		}
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if wait := time.Until(next); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-d.wake[i]:
				// Redraw from now at the new rate.
				if !timer.Stop() {
					<-timer.C
				}
				next = time.Now()
				continue
			case <-timer.C:
			}
		}
		d.send(ctx, c, rng)
	}
}

// send builds one request and sends it on its own goroutine, or records a
// drop when MaxInFlight requests are outstanding.
func (d *Driver) send(ctx context.Context, c *Class, rng *rand.Rand) {
	req, rec := buildRequest(c, rng)
	if d.inFlight.Add(1) > d.maxInFlight {
		d.inFlight.Add(-1)
		rec.Dropped = true
		d.sink.Add(rec)
		return
	}
	d.wg.Go(func() {
		defer d.inFlight.Add(-1)
		// The client's own timeout bounds the call; the run's end does not
		// cut requests short, so the last second is not full of give-ups.
		rec.Result = d.gw.Do(context.WithoutCancel(ctx), req)
		d.sink.Add(rec)
	})
}

// chatBody is an OpenAI chat completions request.
type chatBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// promptWord is 4 characters with its space: one token by the 4
// characters a token that Tollgate's estimate (config/authz) assumes.
const promptWord = "tok "

func buildRequest(c *Class, rng *rand.Rand) (*Request, Record) {
	tn := c.Tenants[rng.IntN(len(c.Tenants))]
	prompt, maxTok := max(c.PromptTokens.draw(rng), 1), max(c.MaxTokens.draw(rng), 1)
	stream := rng.Float64() < c.StreamFraction
	b := chatBody{Model: c.Model, MaxTokens: maxTok, Stream: stream,
		Messages: []chatMessage{{Role: "user", Content: strings.Repeat(promptWord, prompt)}}}
	if stream {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	// A struct of strings, ints and bools always marshals.
	body, _ := json.Marshal(b)
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Authorization", "Bearer "+tn.Key)
	h.Set("X-Sim-Tenant", tn.Name)
	req := &Request{Tenant: tn.Name, Tier: c.Tier, Model: c.Model, Method: http.MethodPost,
		Path: "/v1/chat/completions", Header: h, Body: body, Stream: stream, Timeout: c.Timeout}
	rec := Record{Sent: time.Now(), Class: c.Name, Tier: c.Tier, Tenant: tn.Name, Stream: stream,
		Estimate: int64(prompt + maxTok)}
	return req, rec
}

func f64bits(f float64) uint64 { return math.Float64bits(f) }
func f64from(u uint64) float64 { return math.Float64frombits(u) }
