package authn

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The keys of these tests. No error and no printed Keys or Identity may
// contain one of them or its hash (see noSecret).
const (
	keyAcme     = "sk-acme-0123456789abcdef"
	keyCI       = "sk-acme-ci-bot-fedcba9876543210"
	keyBeta     = "sk-beta-aaaaaaaaaaaaaaaa"
	keyOff      = "sk-acme-disabled-0000000000"
	keyStranger = "sk-nobody-1111111111111111"
)

var testKeys = []string{keyAcme, keyCI, keyBeta, keyOff, keyStranger}

func hashOf(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// noSecret fails the test if text holds a test key or its hash, in any case.
func noSecret(tb testing.TB, what, text string) {
	tb.Helper()
	lower := strings.ToLower(text)
	for _, k := range testKeys {
		if strings.Contains(lower, strings.ToLower(k)) || strings.Contains(lower, hashOf(k)) {
			tb.Errorf("%s shows a key or its hash:\n%s", what, text)
		}
	}
}

var goodKeys = `tenants:
  acme:
    tier: premium
    limits:
      tenant_tokens: {amount: 2000000}
      tenant_requests: {amount: 1200, unit: minute}
  beta:
keys:
  - sha256: "` + strings.ToUpper(hashOf(keyAcme)) + `"
    tenant: acme
  - key: "` + keyCI + `"
    tenant: acme
    tier: standard
    name: ci-bot
    limits: {tenant_requests: {amount: 60}, ci_only: {amount: 5, unit: hour, unit_multiplier: 2}}
  - key: ` + keyBeta + `
    tenant: beta
  - key: ` + keyOff + `
    tenant: acme
    disabled: true
  - sha256: ` + hashOf("sk-undefined-tenant-000") + `
    tenant: gamma
    tier: free
    name: gamma-default
`

func TestLookup(t *testing.T) {
	t.Parallel()
	k, err := Parse("keys.yaml", []byte(goodKeys))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	acmeLimits := map[string]limit.Override{
		"tenant_tokens":   {Amount: 2000000},
		"tenant_requests": {Amount: 1200, Unit: limit.Minute, Multiplier: 1},
	}
	tests := []struct {
		name   string
		give   string
		want   Identity
		wantOK bool
	}{
		{name: "by hash, tenant defaults", give: keyAcme, want: Identity{Tenant: "acme", Tier: "premium", Overrides: acmeLimits}, wantOK: true},
		{
			name: "by key, key over tenant", give: keyCI, wantOK: true,
			want: Identity{Tenant: "acme", Tier: "standard", KeyName: "ci-bot", Overrides: map[string]limit.Override{
				"tenant_tokens":   {Amount: 2000000},
				"tenant_requests": {Amount: 60},
				"ci_only":         {Amount: 5, Unit: limit.Hour, Multiplier: 2},
			}},
		},
		{name: "tenant without defaults", give: keyBeta, want: Identity{Tenant: "beta"}, wantOK: true},
		{name: "tenant never defined", give: "sk-undefined-tenant-000", want: Identity{Tenant: "gamma", Tier: "free", KeyName: "gamma-default"}, wantOK: true},
		{name: "disabled", give: keyOff},
		{name: "unknown", give: keyStranger},
		{name: "empty", give: ""},
		{name: "case matters", give: strings.ToUpper(keyAcme)},
		{name: "a prefix is not the key", give: keyAcme[:len(keyAcme)-1]},
		{name: "the hash is not the key", give: hashOf(keyAcme)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := k.Lookup(tt.give)
			if ok != tt.wantOK || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Lookup = %+v, %t; want %+v, %t", got, ok, tt.want, tt.wantOK)
			}
			noSecret(t, "Identity", fmt.Sprintf("%v %+v %#v", got, got, got))
		})
	}
	if got := k.Len(); got != 4 {
		t.Errorf("Len = %d, want 4 (the disabled key does not count)", got)
	}
	var nilKeys *Keys
	if _, ok := nilKeys.Lookup(keyAcme); ok || nilKeys.Len() != 0 {
		t.Errorf("a nil *Keys found a key or has a length")
	}
}

// TestKeysNeverPrinted prints Keys every way fmt can.
func TestKeysNeverPrinted(t *testing.T) {
	t.Parallel()
	k, err := Parse("keys.yaml", []byte(goodKeys))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	const want = "authn.Keys{keys: 4, disabled: 1, tenants: 2}"
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		if got := fmt.Sprintf(verb, k); got != want {
			t.Errorf("Sprintf(%s, keys) = %q, want %q", verb, got, want)
		}
		// A Keys value cannot reach the methods; it shows a pointer.
		noSecret(t, "a Keys value with "+verb, fmt.Sprintf(verb, *k))
		noSecret(t, "a struct holding Keys with "+verb, fmt.Sprintf(verb, struct{ K *Keys }{k}))
	}
	noSecret(t, "String", k.String())
	if got := fmt.Sprint((*Keys)(nil)); got != "authn.Keys(nil)" {
		t.Errorf("nil Keys prints %q", got)
	}
	// The hashes' bytes must not show either, in any base.
	for _, key := range testKeys {
		h := sha256.Sum256([]byte(key))
		if s := fmt.Sprintf("%#v", *k); strings.Contains(s, fmt.Sprint(h[:4])) || strings.Contains(s, fmt.Sprintf("%#v", h[:4])) {
			t.Errorf("a Keys value shows hash bytes: %s", s)
		}
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give string
		want string
	}{
		{
			name: "empty file",
			give: "",
			want: "keys.yaml:1: file is empty; a keys file needs at least keys: []",
		},
		{
			name: "only comments",
			give: "# keys: []\n",
			want: "keys.yaml:1: file is empty; a keys file needs at least keys: []",
		},
		{
			name: "invalid YAML",
			give: "keys: [\n",
			want: "keys.yaml:1: invalid YAML: did not find expected node content",
		},
		{
			name: "two documents",
			give: "keys: []\n---\nkeys: []\n",
			want: "keys.yaml:2: a second YAML document; the file holds one document",
		},
		{
			name: "a bare key mounted as the keys file",
			give: keyAcme + "\n",
			want: "keys.yaml:1: want a mapping with keys tenants|keys, got a string",
		},
		{
			name: "keys missing, unknown top-level key",
			give: "tenant: {}\n",
			want: "keys.yaml:1: unknown key; did you mean tenants?\nkeys.yaml:1: keys is required",
		},
		{
			name: "a key as a top-level key",
			give: keyAcme + ": acme\nkeys: []\n",
			want: "keys.yaml:1: unknown key (want one of tenants|keys)",
		},
		{
			name: "keys not a list",
			give: "keys: " + keyAcme + "\n",
			want: "keys.yaml:1: keys: want a list of keys, got a string",
		},
		{
			name: "keys as a list of bare keys",
			give: "keys:\n  - " + keyAcme + "\n  - \"" + keyCI + "\"\n",
			want: `keys.yaml:2: keys[0]: want a mapping with keys sha256|key|tenant|tier|name|limits|disabled, got a string
keys.yaml:3: keys[1]: want a mapping with keys sha256|key|tenant|tier|name|limits|disabled, got a string`,
		},
		{
			name: "a map from key to tenant",
			give: "keys:\n  - " + keyAcme + ": acme\n",
			want: `keys.yaml:2: keys[0]: unknown key (want one of sha256|key|tenant|tier|name|limits|disabled)
keys.yaml:2: keys[0]: sha256 or key is required
keys.yaml:2: keys[0]: tenant is required`,
		},
		{
			name: "misspelt field",
			give: "keys:\n  - key: " + keyAcme + "\n    tennant: acme\n",
			want: `keys.yaml:2: keys[0]: tenant is required
keys.yaml:3: keys[0]: unknown key; did you mean tenant?`,
		},
		{
			name: "field repeated",
			give: "keys:\n  - key: " + keyAcme + "\n    key: " + keyCI + "\n    tenant: acme\n",
			want: "keys.yaml:3: keys[0].key: key repeated (first at line 2)",
		},
		{
			name: "both sha256 and key",
			give: "keys:\n  - key: " + keyAcme + "\n    sha256: " + hashOf(keyAcme) + "\n    tenant: acme\n",
			want: "keys.yaml:2: keys[0]: both sha256 and key are set; give the key or its SHA-256, not both",
		},
		{
			name: "bad hashes",
			give: "keys:\n" +
				"  - {sha256: " + hashOf(keyAcme)[:63] + "g, tenant: acme}\n" +
				"  - {sha256: " + hashOf(keyCI)[:62] + ", tenant: acme}\n" +
				"  - {sha256: " + hashOf(keyBeta) + "00, tenant: acme}\n" +
				"  - {sha256: [" + hashOf(keyOff) + "], tenant: acme}\n" +
				"  - {sha256: '', tenant: acme}\n",
			want: `keys.yaml:2: keys[0].sha256: want the key's SHA-256 as 64 hexadecimal digits
keys.yaml:3: keys[1].sha256: want the key's SHA-256 as 64 hexadecimal digits
keys.yaml:4: keys[2].sha256: want the key's SHA-256 as 64 hexadecimal digits
keys.yaml:5: keys[3].sha256: want a string, got a list
keys.yaml:6: keys[4].sha256: want the key's SHA-256 as 64 hexadecimal digits`,
		},
		{
			name: "weak and untrimmed keys",
			give: "keys:\n" +
				"  - {key: sk-short-123456, tenant: acme}\n" +
				"  - {key: '', tenant: acme}\n" +
				"  - {key: ' " + keyAcme + "', tenant: acme}\n" +
				"  - {key: \"" + keyCI + "\\t\", tenant: acme}\n" +
				"  - {key: {" + keyBeta + ": 1}, tenant: acme}\n" +
				"  - {key: , tenant: acme}\n",
			want: `keys.yaml:2: keys[0].key: is shorter than 16 bytes, too easy to guess
keys.yaml:3: keys[1].key: is shorter than 16 bytes, too easy to guess
keys.yaml:4: keys[2].key: begins or ends with a space or tab, which a presented key never does
keys.yaml:5: keys[3].key: begins or ends with a space or tab, which a presented key never does
keys.yaml:6: keys[4].key: want a string, got a mapping
keys.yaml:7: keys[5]: sha256 or key is required`,
		},
		{
			name: "the same key twice: as a key, as its hash, and disabled",
			give: "keys:\n" +
				"  - key: " + keyAcme + "\n    tenant: acme\n" +
				"  - {key: " + keyCI + ", tenant: acme}\n" +
				"  - sha256: " + hashOf(keyAcme) + "\n    tenant: beta\n" +
				"  - {key: " + keyCI + ", tenant: acme, disabled: true}\n",
			want: `keys.yaml:5: keys[2]: the same key as keys[0] at line 2; a key may be listed once
keys.yaml:7: keys[3]: the same key as keys[1] at line 4; a key may be listed once`,
		},
		{
			name: "tenant missing, empty, not a string",
			give: "keys:\n" +
				"  - {key: " + keyAcme + "}\n" +
				"  - {key: " + keyCI + ", tenant: ''}\n" +
				"  - {key: " + keyBeta + ", tenant: [acme], tier: '', name: {a: b}}\n",
			want: `keys.yaml:2: keys[0]: tenant is required
keys.yaml:3: keys[1].tenant: is empty
keys.yaml:4: keys[2].tenant: want a string, got a list
keys.yaml:4: keys[2].tier: is empty
keys.yaml:4: keys[2].name: want a string, got a mapping`,
		},
		{
			name: "tier and name too long",
			give: "keys:\n" +
				"  - {key: " + keyAcme + ", tenant: acme, tier: " + strings.Repeat("t", limit.MaxValueBytes+1) + "}\n" +
				"  - {key: " + keyCI + ", tenant: acme, name: " + strings.Repeat("n", limit.MaxValueBytes+1) + "}\n",
			want: `keys.yaml:2: keys[0].tier: is 1025 bytes, more than 1024
keys.yaml:3: keys[1].name: is 1025 bytes, more than 1024`,
		},
		{
			name: "limits of a key",
			give: "keys:\n" +
				"  - key: " + keyAcme + "\n" +
				"    tenant: acme\n" +
				"    disabled: maybe\n" +
				"    limits:\n" +
				"      a: {unit: minute}\n" +
				"      b: {amount: -1, unit: dya}\n" +
				"      c: {amount: 1, unit_multiplier: 2}\n" +
				"      d: {amount: 1, unit: year, unit_multiplier: 300}\n" +
				"      e: {amount: 1.5, units: hour}\n" +
				"      f: 10\n" +
				"      a: {amount: 1}\n" +
				"      '': {amount: 1}\n" +
				"  - {key: " + keyCI + ", tenant: acme, limits: " + keyBeta + "}\n",
			want: `keys.yaml:4: keys[0].disabled: want true or false, got a string
keys.yaml:6: keys[0].limits.a: amount is required
keys.yaml:7: keys[0].limits.b.amount: -1 is negative
keys.yaml:7: keys[0].limits.b.unit: is not one of second|minute|hour|day|week|month|year
keys.yaml:8: keys[0].limits.c.unit_multiplier: applies only with a unit; without one the rule's window is kept
keys.yaml:9: keys[0].limits.d.unit_multiplier: 300 years is longer than the longest window, 292 years
keys.yaml:10: keys[0].limits.e: unknown key; did you mean unit?
keys.yaml:10: keys[0].limits.e.amount: want a whole number, got 1.5
keys.yaml:11: keys[0].limits.f: want a mapping with keys amount|unit|unit_multiplier, got a number
keys.yaml:12: keys[0].limits.a: repeated (first at line 6)
keys.yaml:13: keys[0].limits: a name is empty
keys.yaml:14: keys[1].limits: want a mapping of limit names to {amount, unit, unit_multiplier}, got a string`,
		},
		{
			name: "tenants",
			give: "tenants:\n" +
				"  acme: {tierr: premium}\n" +
				"  beta: premium\n" +
				"  acme: {}\n" +
				"  [x]: {}\n" +
				"  gamma: {tier: [a], limits: [a]}\n" +
				"keys: []\n",
			want: `keys.yaml:2: tenants.acme: unknown key; did you mean tier?
keys.yaml:3: tenants.beta: want a mapping with keys tier|limits, got a string
keys.yaml:4: tenants.acme: repeated (first at line 2)
keys.yaml:5: tenants: a name must be a string, got a list
keys.yaml:6: tenants.gamma.tier: want a string, got a list
keys.yaml:6: tenants.gamma.limits: want a mapping of limit names to {amount, unit, unit_multiplier}, got a list`,
		},
		{
			name: "YAML 1.1 booleans and quoted numbers",
			give: "keys:\n  - {key: " + keyAcme + ", tenant: a, disabled: yes, limits: {x: {amount: '5'}, y: {amount: 1, unit: hour, unit_multiplier: [2]}}}\n",
			want: `keys.yaml:2: keys[0].limits.x.amount: want a whole number, got a string
keys.yaml:2: keys[0].limits.y.unit_multiplier: want a whole number, got a list
keys.yaml:2: keys[0].disabled: want true or false, got a string`,
		},
		{
			name: "tenants not a mapping",
			give: "tenants: [acme]\nkeys: []\n",
			want: "keys.yaml:1: tenants: want a mapping of tenant names to their defaults, got a list",
		},
		{
			name: "a tenant name too long",
			give: "tenants:\n  ? " + strings.Repeat("t", limit.MaxValueBytes+1) + "\n  : {tier: a}\nkeys: []\n",
			want: "keys.yaml:2: tenants." + strings.Repeat("t", limit.MaxValueBytes+1) + ": the name is 1025 bytes, more than 1024",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := Parse("keys.yaml", []byte(tt.give))
			if err == nil {
				t.Fatalf("Parse = %v, want an error", k)
			}
			if k != nil {
				t.Errorf("Parse returned keys with its error")
			}
			var probs config.Errors
			if !errors.As(err, &probs) {
				t.Errorf("error is a %T, want config.Errors", err)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("error:\n%s\nwant:\n%s", got, tt.want)
			}
			noSecret(t, "error", err.Error())
		})
	}
}

func TestParseEmptyKeys(t *testing.T) {
	t.Parallel()
	for _, give := range []string{"keys: []", "tenants: {acme: {tier: a}}\nkeys: []\n---\n"} {
		k, err := Parse("keys.yaml", []byte(give))
		if err != nil || k.Len() != 0 {
			t.Errorf("Parse(%q) = %v, %v; want no keys and no error", give, k, err)
		}
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.yaml")
	writeFile(t, path, goodKeys)
	k, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if id, ok := k.Lookup(keyCI); !ok || id.KeyName != "ci-bot" {
		t.Errorf("Lookup after Load = %+v, %t", id, ok)
	}

	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "keys:\n  - {key: "+keyAcme+"}\n")
	if _, err := Load(bad); err == nil || err.Error() != bad+":2: keys[0]: tenant is required" {
		t.Errorf("Load(bad) error = %v", err)
	}

	missing := filepath.Join(dir, "nope.yaml")
	if _, err := Load(missing); !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), fmt.Sprintf("load keys %q: ", missing)) {
		t.Errorf("Load(missing) error = %v, want a wrapped fs.ErrNotExist", err)
	}

	huge := filepath.Join(dir, "huge.yaml")
	writeFile(t, huge, "# "+strings.Repeat("x", config.MaxFileBytes))
	if _, err := Load(huge); err == nil || err.Error() != huge+": file is larger than 4 MiB, the most it may hold" {
		t.Errorf("Load(huge) error = %v", err)
	}
}

func writeFile(tb testing.TB, path, data string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		tb.Fatal(err)
	}
}

func BenchmarkLookup(b *testing.B) {
	k, err := Parse("keys.yaml", []byte(goodKeys))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := k.Lookup(keyCI); !ok {
			b.Fatal("not found")
		}
	}
}

// TestWeakHashes: a sha256 field holding another digest, or the SHA-256
// of the empty string, is refused with its line and path, never its value.
func TestWeakHashes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ give, want string }{
		{strings.Repeat("ab", 16), "keys.yaml:2: keys[0].sha256: is 32 hexadecimal digits, the length of an MD5; want the key's SHA-256"},
		{strings.Repeat("ab", 20), "keys.yaml:2: keys[0].sha256: is 40 hexadecimal digits, the length of a SHA-1; want the key's SHA-256"},
		{"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "keys.yaml:2: keys[0].sha256: is the SHA-256 of the empty string"},
		{strings.Repeat("zz", 32), "keys.yaml:2: keys[0].sha256: want the key's SHA-256 as 64 hexadecimal digits"},
	} {
		_, err := Parse("keys.yaml", []byte("keys:\n  - sha256: \""+tt.give+"\"\n    tenant: t\n"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("sha256 %s: error %v, want %q", tt.give, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), tt.give) {
			t.Errorf("the error quotes the hash: %v", err)
		}
	}
}

// TestRefs: the tiers and limit names a keys file uses are listed with
// where they are, for the check against the rules.
func TestRefs(t *testing.T) {
	t.Parallel()
	k, err := Parse("keys.yaml", []byte(`tenants:
  acme:
    tier: premium
    limits: {tenant_requests: {amount: 5}}
keys:
  - key: "0123456789abcdefXYZ"
    tenant: acme
    tier: gold
    limits:
      tokens_day: {amount: 9}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Ref{
		{Kind: RefTier, Name: "premium", Line: 3, Path: "tenants.acme.tier"},
		{Kind: RefLimit, Name: "tenant_requests", Line: 4, Path: "tenants.acme.limits.tenant_requests"},
		{Kind: RefTier, Name: "gold", Line: 8, Path: "keys[0].tier"},
		{Kind: RefLimit, Name: "tokens_day", Line: 10, Path: "keys[0].limits.tokens_day"},
	}
	if got := k.Refs(); !reflect.DeepEqual(got, want) {
		t.Errorf("Refs() = %+v\nwant %+v", got, want)
	}
}
