package extauthz

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/encoding/prototext"

	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKeysNeverLogged runs Check at debug level with valid, invalid,
// disabled and missing keys, in every header and answer, and scans the
// log, the responses and the metrics for the keys.
func TestKeysNeverLogged(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(&logs), zap.DebugLevel))
	const invalid = "sk-invalid-key-fedcba9876543210"
	secrets := []string{keyAcme, keySmall, keyOff, invalid}

	set := newSettings(t, testSettings)
	ok := newHarness(t, memstore.New(), set, log)
	broken := newHarness(t, failStore{errors.New("store down")}, set, log)
	var out strings.Builder
	for _, h := range []*harness{ok, broken} {
		for _, req := range []*authv3.CheckRequest{
			checkRequest(chatBody("gpt-4o", 40, 10), "authorization", bearer(keyAcme)),
			checkRequest(chatBody("gpt-4o", 40, 10), "x-api-key", keySmall),
			checkRequest(chatBody("gpt-4o", 40, 10), "authorization", bearer(invalid)),
			checkRequest(chatBody("gpt-4o", 40, 10), "x-api-key", invalid),
			checkRequest(chatBody("gpt-4o", 40, 10), "authorization", bearer(keyOff)),
			checkRequest(chatBody("gpt-4o", 40, 10)),
			checkRequest(`not json`, "authorization", bearer(keyAcme)),
			checkRequest(chatBody("gpt-4o", 40, 999999), "authorization", bearer(keyAcme)),
			checkRequest(strings.Repeat("x", 5000), "authorization", bearer(keyAcme)),
		} {
			resp, err := h.client.Check(context.Background(), req)
			out.WriteString(prototext.Format(resp))
			if err != nil {
				out.WriteString(err.Error())
			}
		}
	}
	var metrics bytes.Buffer
	for _, reg := range []*prometheus.Registry{ok.reg, broken.reg} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(&metrics, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !strings.Contains(logs.String(), "authz refused") || !strings.Contains(logs.String(), "authz decision failed") {
		t.Fatalf("the test logged too little to mean anything:\n%s", logs.String())
	}
	for _, k := range secrets {
		for what, text := range map[string]string{"log": logs.String(), "responses": out.String(), "metrics": metrics.String()} {
			if strings.Contains(text, k) {
				t.Errorf("key %q appears in the %s:\n%s", k, what, text)
			}
		}
	}
}

// TestLogNamesNoKeyOnRefusal: a refusal is logged with its reason, which
// is the client's message and never holds the key.
func TestLogNamesNoKeyOnRefusal(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&logs), zap.DebugLevel))
	h := newHarness(t, memstore.New(), newSettings(t, testSettings), log)
	h.check(t, checkRequest(chatBody("gpt-4o", 4, 1), "authorization", bearer("sk-not-a-key-at-all-000")))
	if got := logs.String(); !strings.Contains(got, `"reason":"The API key provided is not valid."`) || strings.Contains(got, "sk-not-a-key") {
		t.Errorf("log:\n%s", got)
	}
}
