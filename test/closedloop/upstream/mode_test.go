package upstream

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestModes sends requests one after the other, at one instant, in each
// mode, and checks every answer and the mode's counters.
func TestModes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		give       Mode
		n          int
		want       []int // statuses
		wantCounts Counts
	}{
		{
			name:       "normal",
			give:       Mode{},
			n:          3,
			want:       []int{200, 200, 200},
			wantCounts: Counts{Received: 3, Served: 3},
		},
		{
			name:       "fail every request",
			give:       Mode{Kind: Fail},
			n:          3,
			want:       []int{500, 500, 500},
			wantCounts: Counts{Received: 3, Failed: 3},
		},
		{
			name:       "fail a quarter, evenly",
			give:       Mode{Kind: Fail, FailFraction: 0.25, FailStatus: 502},
			n:          8,
			want:       []int{200, 200, 200, 502, 200, 200, 200, 502},
			wantCounts: Counts{Received: 8, Served: 6, Failed: 2},
		},
		{
			name:       "vendor 429 over the rate",
			give:       Mode{Kind: Vendor429, Rate: 2},
			n:          3,
			want:       []int{200, 200, 429},
			wantCounts: Counts{Received: 3, Served: 2, Vendor429: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				u := newUpstream(t, fixed(0))
				if err := u.SetMode(tt.give); err != nil {
					t.Fatalf("SetMode: %v", err)
				}
				var got []int
				for range tt.n {
					r := send(t.Context(), u, ChatBody("m", 8, 4, false), "")
					got = append(got, r.status)
					switch r.status {
					case http.StatusOK:
						decodeJSON(t, r.body())
					case http.StatusTooManyRequests:
						if c := errorCode(t, r.body()); c != "rate_limit_exceeded" {
							t.Errorf("429 code %q", c)
						}
						h := r.header
						if h.Get("Retry-After") != "1" || h.Get("X-Ratelimit-Reset-Requests") != "500ms" ||
							h.Get("X-Ratelimit-Limit-Requests") != "2" || h.Get("X-Ratelimit-Remaining-Requests") != "0" {
							t.Errorf("429 headers %v", h)
						}
					default:
						if c := errorCode(t, r.body()); c != "" {
							t.Errorf("5xx code %q, want null", c)
						}
					}
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("statuses (-want +got):\n%s", diff)
				}
				st := u.Stats()
				if st.ByMode[tt.give.Kind.String()] != tt.wantCounts || st.Totals != tt.wantCounts {
					t.Errorf("counts %+v, totals %+v, want %+v", st.ByMode[tt.give.Kind.String()], st.Totals, tt.wantCounts)
				}
			})
		})
	}
}

// TestVendor429Refills checks the vendor's token bucket refills at its
// rate, and that switching back to Normal serves everything.
func TestVendor429Refills(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		u := newUpstream(t, fixed(0))
		if err := u.SetMode(Mode{Kind: Vendor429, Rate: 2}); err != nil {
			t.Fatal(err)
		}
		status := func() int { return send(t.Context(), u, ChatBody("m", 8, 4, false), "").status }
		got := []int{status(), status(), status()}
		time.Sleep(500 * time.Millisecond) // the bubble's clock: one token back
		got = append(got, status(), status())
		if err := u.SetMode(Mode{}); err != nil {
			t.Fatal(err)
		}
		got = append(got, status(), status(), status())
		if diff := cmp.Diff([]int{200, 200, 429, 200, 429, 200, 200, 200}, got); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		st := u.Stats()
		want := map[string]Counts{
			"normal":    {Received: 3, Served: 3},
			"fail":      {},
			"vendor429": {Received: 5, Served: 3, Vendor429: 2},
		}
		if diff := cmp.Diff(want, st.ByMode); diff != "" {
			t.Errorf("by mode (-want +got):\n%s", diff)
		}
	})
}

func TestModeValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give Mode
		want string // a part of the error; "" for none
	}{
		{name: "normal", give: Mode{}},
		{name: "fail defaults", give: Mode{Kind: Fail}},
		{name: "fail fraction above 1", give: Mode{Kind: Fail, FailFraction: 1.5}, want: "fail fraction"},
		{name: "fail fraction NaN", give: Mode{Kind: Fail, FailFraction: nan()}, want: "fail fraction"},
		{name: "fail status not 5xx", give: Mode{Kind: Fail, FailStatus: 404}, want: "fail status"},
		{name: "vendor without a rate", give: Mode{Kind: Vendor429}, want: "rate"},
		{name: "vendor negative burst", give: Mode{Kind: Vendor429, Rate: 1, Burst: -1}, want: "burst"},
		{name: "unknown kind", give: Mode{Kind: numKinds}, want: "kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.give.Validate()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("Validate() = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestModeEndpoint switches modes through PUT /mode.
func TestModeEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		method     string
		give       string
		wantStatus int
		want       Mode // the mode after
	}{
		{name: "get", method: http.MethodGet, wantStatus: 200, want: Mode{}},
		{name: "fail", method: http.MethodPut, give: `{"kind":"fail","fail_fraction":0.5}`, wantStatus: 200, want: Mode{Kind: Fail, FailFraction: 0.5, FailStatus: 500}},
		{name: "vendor", method: http.MethodPost, give: `{"kind":"vendor429","rate":10}`, wantStatus: 200, want: Mode{Kind: Vendor429, Rate: 10, Burst: 10}},
		{name: "unknown field", method: http.MethodPut, give: `{"kind":"fail","fraction":0.5}`, wantStatus: 400},
		{name: "unknown kind", method: http.MethodPut, give: `{"kind":"broken"}`, wantStatus: 400},
		{name: "invalid", method: http.MethodPut, give: `{"kind":"fail","fail_status":200}`, wantStatus: 400},
		{name: "not JSON", method: http.MethodPut, give: `kind=fail`, wantStatus: 400},
		{name: "too large", method: http.MethodPut, give: `{"kind":"fail"` + strings.Repeat(" ", maxModeBody) + `}`, wantStatus: 400},
		{name: "delete", method: http.MethodDelete, wantStatus: 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream(t, nil)
			w := httptest.NewRecorder()
			u.ServeHTTP(w, httptest.NewRequest(tt.method, ModePath, strings.NewReader(tt.give)))
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.wantStatus, w.Body)
			}
			if w.Code != http.StatusOK {
				errorCode(t, w.Body.String())
				if u.Mode() != (Mode{}) {
					t.Errorf("mode %+v after a refused change", u.Mode())
				}
				return
			}
			if got := u.Mode(); got != tt.want {
				t.Errorf("mode %+v, want %+v", got, tt.want)
			}
		})
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}
