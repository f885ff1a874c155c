package authn

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/pkg/config"
)

// FuzzParse feeds Parse arbitrary bytes. It must never panic, and its
// answer must be keys that answer Lookup, or config.Errors in which every
// problem names the file.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		goodKeys,
		"keys: []",
		"tenants: {a: }\nkeys: [{key: " + keyAcme + ", tenant: a, limits: {x: {amount: 0}}}]",
		"keys: [&k {sha256: " + hashOf(keyAcme) + ", tenant: a}, *k]",
		"keys: [{key: " + keyAcme + ", sha256: 00, tenant: a, disabled: yes}]",
		"tenants: &t {a: *t}\nkeys: []",
		keyAcme,
		"keys:\n  - " + keyAcme + ": a\n",
		"keys: [{key: k, tenant: t, limits: {l: {amount: 1, unit: year, unit_multiplier: 4294967295}}}]",
		"keys: []\n---\nkeys: []",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := Parse("k.yaml", data)
		checkEach(t, data, k, err)
		if err != nil {
			var probs config.Errors
			if !errors.As(err, &probs) || len(probs) == 0 {
				t.Fatalf("Parse error = %#v, want Problems", err)
			}
			for _, p := range probs {
				if p.File != "k.yaml" || p.Msg == "" || p.Line < 0 {
					t.Fatalf("problem %+v, want File k.yaml, a message and a line >= 0", p)
				}
			}
			if k != nil {
				t.Fatalf("Parse returned keys with its error")
			}
			return
		}
		if k == nil {
			t.Fatalf("Parse returned neither keys nor an error")
		}
		for _, s := range []string{"", keyAcme, string(data)} {
			if id, ok := k.Lookup(s); ok && id.Tenant == "" {
				t.Fatalf("Lookup found an identity without a tenant")
			}
		}
		if !strings.HasPrefix(k.String(), "authn.Keys{") {
			t.Fatalf("String = %q", k.String())
		}
	})
}

// FuzzSecretsNeverQuoted puts a secret everywhere a key might be written,
// rightly or by mistake, and checks that neither the secret nor its hash
// reaches an error or the printed Keys.
// checkEach checks ParseEach against Parse's result on the same file: the
// same keys when Parse accepts it, else either the same error or keys that
// say they left entries out.
func checkEach(t *testing.T, data []byte, strict *Keys, strictErr error) {
	t.Helper()
	k, err := ParseEach("k.yaml", data)
	switch {
	case strictErr == nil && (err != nil || k.Len() != strict.Len() || k.Skipped() != 0 || k.Problems() != nil):
		t.Fatalf("ParseEach = %v, %v; Parse accepted %v", k, err, strict)
	case strictErr != nil && err != nil && err.Error() != strictErr.Error():
		t.Fatalf("ParseEach error:\n%v\nParse error:\n%v", err, strictErr)
	case err != nil && k != nil:
		t.Fatalf("ParseEach returned keys with its error")
	case strictErr != nil && err == nil && (k == nil || k.Skipped() == 0 || k.Problems() == nil):
		t.Fatalf("ParseEach = %v with problems %v; Parse refused the file, so some entry must be left out", k, k.Problems())
	}
}

func FuzzSecretsNeverQuoted(f *testing.F) {
	for _, s := range []string{keyAcme, "sk-", "sk-short", "sk- spaced out key \t", "sk-\"quoted\": [x]", "sk-ünïcødé-0123456789"} {
		f.Add(s)
	}
	templates := []string{
		"%[1]s",
		"keys: %[1]s",
		"keys: [%[1]s]",
		"keys:\n  - %[1]s: acme\n",
		"%[1]s:\n  - {key: %[1]s, tenant: a}\n",
		"keys:\n  - {key: %[1]s, tenant: a}\n  - {key: %[1]s, tenant: b}\n",
		"keys:\n  - {key: %[1]s, tenant: a}\n  - {sha256: %[2]s, tenant: b}\n",
		"keys:\n  - {key: %[1]s, sha256: %[2]s, tenant: a}\n",
		"keys:\n  - {sha256: %[1]s, tenant: a}\n",
		"keys:\n  - {key: [%[1]s], tenant: a}\n",
		"keys:\n  - {key: {%[1]s: 1}, tenant: a}\n",
		"keys:\n  - {key: %[1]s, tenant: a, limits: %[1]s}\n",
		"keys:\n  - {key: %[1]s, tenant: a, %[1]s: 1}\n",
		"keys:\n  - key: %[1]s\n    tenant: a\n    limits: {x: %[1]s}\n",
		"keys:\n  - key: %[1]s\n  tenant: a\n",
		"keys:\n  - {key: %[1]s, tenant: a, disabled: %[1]s, limits: {x: {amount: %[1]s, unit: %[1]s, unit_multiplier: %[1]s}}}\n",
		"tenants: {a: %[1]s, b: {tier: t, %[1]s: 1}, c: {limits: {x: {amount: 1, %[1]s: 1}}}}\nkeys: []\n",
	}
	f.Fuzz(func(t *testing.T, secret string) {
		// The prefix keeps the secret from matching the fixed text of a
		// message by chance; nothing in the messages says "sk-".
		if !strings.HasPrefix(secret, "sk-") || !utf8.ValidString(secret) {
			return
		}
		quoted, err := json.Marshal(secret) // JSON strings are YAML double-quoted scalars
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(secret))
		hash := hex.EncodeToString(sum[:])
		for _, tmpl := range templates {
			data := fmt.Sprintf(tmpl, quoted, hash)
			k, err := Parse("k.yaml", []byte(data))
			var out string
			if err != nil {
				out = err.Error()
			} else {
				out = fmt.Sprintf("%v %+v %#v %s", k, k, *k, k)
			}
			if each, err := ParseEach("k.yaml", []byte(data)); err == nil && each.Problems() != nil {
				out += "\n" + each.Problems().Error()
			}
			if strings.Contains(out, secret) || strings.Contains(strings.ToLower(out), hash) {
				t.Fatalf("file:\n%s\nshows the secret or its hash:\n%s", data, out)
			}
		}
	})
}

// FuzzKeyFromHeaders checks that whatever the headers hold, a key found is
// non-empty, trimmed, and taken from one of them.
func FuzzKeyFromHeaders(f *testing.F) {
	for _, s := range [][2]string{
		{"Bearer " + keyAcme, ""},
		{"bearer\t x ", "y"},
		{"Basic abc", keyCI},
		{"Bearer", " "},
		{"", ""},
		{"BEARER  \t", "\t"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, auth, apiKey string) {
		h := map[string]string{"authorization": auth, "x-api-key": apiKey}
		k, ok := KeyFromHeaders(func(name string) string { return h[name] }, []string{"authorization", "x-api-key"})
		if !ok {
			if k != "" {
				t.Fatalf("no key found, but %q returned", k)
			}
			if strings.Trim(apiKey, " \t") != "" {
				t.Fatalf("x-api-key %q holds a key that was not found", apiKey)
			}
			return
		}
		if k == "" || strings.Trim(k, " \t") != k {
			t.Fatalf("key %q is empty or untrimmed", k)
		}
		if !strings.HasSuffix(strings.Trim(auth, " \t"), k) && k != strings.Trim(apiKey, " \t") {
			t.Fatalf("key %q comes from neither header (%q, %q)", k, auth, apiKey)
		}
	})
}
