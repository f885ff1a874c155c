// Package authn turns the API key a request presents into who sent it: a
// tenant, a tier and the tenant's or key's own limits.
//
// Keys live in their own YAML file, apart from the rules, so a Kubernetes
// Secret can hold them:
//
//	tenants:                        # (Optional) defaults per tenant
//	  acme:
//	    tier: premium               # (Optional) the tier of acme's keys; default none (the rules' tiers.default)
//	    limits:                     # (Optional) overrides of rule limits, by limit name (rate_limit.name, token_limit.name)
//	      tenant_gpt4o_tokens: {amount: 2000000}         # amount only: the rule's window is kept
//	      tenant_requests: {amount: 1200, unit: minute}  # or a new window: unit, and unit_multiplier (default 1)
//	keys:                           # (Required) may be empty
//	  - sha256: "9f86d0..."         # the key's SHA-256 in hex (64 digits), or
//	    # key: "sk-..."             # the key itself, hashed on load and never kept; at least 16 bytes
//	    tenant: acme                # (Required) need not be under tenants
//	    tier: standard              # (Optional) overrides the tenant's tier
//	    name: ci-bot                # (Optional) a label for logs and metrics, never the key; default none
//	    limits: {tenant_requests: {amount: 60}}  # (Optional) this key's overrides: over the tenant's, over the rule
//	    disabled: false             # (Optional) true refuses the key; default false
//
// A key or its hash never appears in an error, a log line or the printed
// form of Keys. Since a key may be written where it does not belong (a
// bare key as the whole file or as a list item, a key as a field name),
// problems never quote a value of the file: they give its line, its path
// and its kind. Paths do carry the names of tenants and limits.
package authn

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// MinKeyBytes is the length of the shortest key a keys file may list:
// shorter ones are too easy to guess.
const MinKeyBytes = 16

// maxAmount keeps amounts exact where the Redis store counts, as for rules.
const maxAmount = 1 << 53

// The sizes of the digests a sha256 field must not hold.
const md5Bytes, sha1Bytes = 16, 20

// emptyHash is the SHA-256 of the empty string, what sha256sum prints
// for a key variable that was never set.
var emptyHash = sha256.Sum256(nil)

// The keys each mapping accepts, in the order error messages list them.
var (
	fileKeys     = []string{"tenants", "keys"}
	tenantKeys   = []string{"tier", "limits"}
	keyKeys      = []string{"sha256", "key", "tenant", "tier", "name", "limits", "disabled"}
	overrideKeys = []string{"amount", "unit", "unit_multiplier"}
)

// Identity is who presented a key.
type Identity struct {
	Tenant string
	// Tier is the key's tier, else its tenant's; empty when neither has one.
	Tier string
	// KeyName is the key's label, for logs and metrics; empty when it has none.
	KeyName string
	// Overrides are the limits of the key over those of its tenant, by
	// limit name; nil when neither has any. The map is shared by every
	// Lookup of the key: read it, never write it.
	Overrides map[string]limit.Override
}

// Keys is a loaded keys file. It is immutable, so one value can serve
// every request while a reload builds the next one.
type Keys struct {
	// The set is behind a pointer so that even printing a Keys value with
	// %#v, which cannot reach Format's pointer receiver, shows an address
	// and no hash.
	set *keySet
}

type keySet struct {
	// byHash holds the enabled keys by the SHA-256 of the key.
	byHash   map[[sha256.Size]byte]*entry
	disabled int
	tenants  int
	// skipped counts the entries ParseEach left out, and problems says
	// why; both are zero from Parse.
	skipped  int
	problems config.Errors
	// refs are the tiers and limit names the file uses.
	refs []Ref
}

// RefKind is what a Ref names.
type RefKind uint8

const (
	// RefTier is a tier (a tenant's or a key's tier).
	RefTier RefKind = iota + 1
	// RefLimit is a limit name (a key of limits).
	RefLimit
)

func (k RefKind) String() string {
	if k == RefTier {
		return "tier"
	}
	return "limit"
}

// Ref is a name in a keys file that only the rules can resolve: a tier,
// which must be a plan of the rules' tiers, or a limit name, which must
// name a rate_limit or token_limit. It says where the name is, so that
// tollgate validate and serve can point at it (extauthz.Settings.Against).
// Names are not secrets: problems may quote them, as they quote tenants.
type Ref struct {
	Kind RefKind
	Name string
	Line int
	Path string
}

type entry struct {
	hash [sha256.Size]byte
	id   Identity
}

// Lookup returns the identity of the presented key, and false for a key
// that is not listed or is disabled.
func (k *Keys) Lookup(presented string) (Identity, bool) {
	if k == nil || presented == "" {
		return Identity{}, false
	}
	// Hashed from a copy on the stack: a conversion allocates for a key
	// longer than 32 bytes, and Lookup runs on every request.
	var buf [256]byte
	h := sha256.Sum256(append(buf[:0], presented...))
	e, ok := k.set.byHash[h]
	// The map finds the entry by comparing hashes, which says nothing
	// useful about the key (SHA-256 is preimage resistant); the constant-
	// time compare keeps the confirmation free of timing all the same.
	if !ok || subtle.ConstantTimeCompare(h[:], e.hash[:]) != 1 {
		return Identity{}, false
	}
	return e.id, true
}

// LookupHash is Lookup by the key's SHA-256, for tools that are given
// the hash a keys file lists rather than the key (tollgate explain).
func (k *Keys) LookupHash(hash [sha256.Size]byte) (Identity, bool) {
	if k == nil {
		return Identity{}, false
	}
	e, ok := k.set.byHash[hash]
	if !ok {
		return Identity{}, false
	}
	return e.id, true
}

// Single is a Keys that accepts one key, as id: what tollgate explain
// presents in place of a key it knows only by hash.
func Single(key string, id Identity) *Keys {
	h := sha256.Sum256([]byte(key))
	return &Keys{set: &keySet{byHash: map[[sha256.Size]byte]*entry{h: {hash: h, id: id}}}}
}

// Len is the number of keys Lookup accepts: the enabled ones.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.set.byHash)
}

// Refs are the tiers and limit names the file uses, in file order: every
// listing, including those a reload left out.
func (k *Keys) Refs() []Ref {
	if k == nil || k.set == nil {
		return nil
	}
	return k.set.refs
}

// Skipped is how many entries of the file, under tenants and under keys,
// ParseEach left out for their problems; always 0 from Parse.
func (k *Keys) Skipped() int {
	if k == nil {
		return 0
	}
	return k.set.skipped
}

// Problems are the problems of the entries ParseEach left out, sorted by
// line, as a config.Errors; nil when none. Like every error of this
// package they name lines and paths, never a value of the file.
func (k *Keys) Problems() error {
	if k == nil || len(k.set.problems) == 0 {
		return nil
	}
	return k.set.problems
}

// String counts what k holds, and nothing more.
func (k *Keys) String() string {
	if k == nil {
		return "authn.Keys(nil)"
	}
	s := fmt.Sprintf("authn.Keys{keys: %d, disabled: %d, tenants: %d", len(k.set.byHash), k.set.disabled, k.set.tenants)
	if k.set.skipped > 0 {
		s += fmt.Sprintf(", skipped: %d", k.set.skipped)
	}
	return s + "}"
}

// Format prints String for every verb, %#v included, so no format
// string can print a hash.
func (k *Keys) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, k.String()) }

var _ fmt.Formatter = (*Keys)(nil)

// Load reads a keys file. Bad contents yield a config.Errors with every
// problem; a file that cannot be read yields a wrapped I/O error.
func Load(path string) (*Keys, error) {
	data, err := config.ReadCapped(path)
	if err != nil {
		return nil, fmt.Errorf("load keys %q: %w", path, err)
	}
	return Parse(path, data)
}

// Parse compiles a keys file's bytes; name is used in errors. The error,
// when there is one, is a config.Errors with every problem found, up to 50.
// It is strict, for the load at start: one bad entry refuses the file.
func Parse(name string, data []byte) (*Keys, error) {
	p := newParser(name, false)
	k := p.parse(data)
	if err := p.w.Err(); err != nil {
		return nil, err
	}
	return k, nil
}

// ParseEach is Parse for a reload, which applies the file entry by entry
// rather than all or nothing: keeping the previous keys because one entry
// is bad would keep every key the new file removes or disables.
//
// An entry with a problem is left out, and the rest apply: a tenant under
// tenants with a problem, with every key of that tenant (its defaults are
// unknown, and a key must not get more than they give); a key under keys
// with a problem; and every listing of a key listed more than once (they
// may disagree, one disabled, one not). A key left out is refused, as an
// unknown one is. The result's Skipped and Problems say what was left out
// and why.
//
// Only a file that cannot be used at all is an error, a config.Errors
// with every problem found: one that is empty, not YAML, more than one
// document, larger than config.MaxFileBytes, not a mapping of tenants and
// keys (an unknown top-level key included), whose tenants is not a
// mapping or keys not a list, or that has more than 50 problems or
// aliases that expand too far (the walk stops there, so the entries after
// it cannot be read whole).
func ParseEach(name string, data []byte) (*Keys, error) {
	p := newParser(name, true)
	k := p.parse(data)
	err := p.w.Err()
	if err == nil {
		return k, nil
	}
	var problems config.Errors
	if k == nil || p.fatal || p.w.Stopped() || p.skipped == 0 || !errors.As(err, &problems) {
		// p.skipped == 0 with problems would be a problem tied to no
		// entry: refuse the file rather than guess what it meant.
		return nil, err
	}
	k.set.skipped, k.set.problems = p.skipped, problems
	return k, nil
}

type parser struct {
	w       *config.Walker
	tenants map[string]tenant
	// each is set by ParseEach: leave out bad entries, apply the rest.
	each bool
	// fatal says the file as a whole is unusable, whatever each says.
	fatal bool
	// badTenants are the tenants left out, with the line of the first
	// listing; skipped counts the entries left out.
	badTenants map[string]int
	skipped    int
	refs       []Ref
}

// ref records a name only the rules resolve, at n.
func (p *parser) ref(kind RefKind, name string, n *yaml.Node, path string) {
	if name != "" {
		p.refs = append(p.refs, Ref{Kind: kind, Name: name, Line: p.w.Resolve(n).Line, Path: path})
	}
}

func newParser(name string, each bool) *parser {
	return &parser{w: config.NewWalker(name), tenants: map[string]tenant{}, each: each, badTenants: map[string]int{}}
}

func (p *parser) parse(data []byte) *Keys {
	if root := p.w.Document(data, "file is empty; a keys file needs at least keys: []"); root != nil {
		return p.file(root)
	}
	return nil
}

// badTenant leaves out the tenant name listed at line, counting it once.
func (p *parser) badTenant(name string, line int) {
	if _, bad := p.badTenants[name]; !bad {
		p.badTenants[name] = line
		p.skipped++
	}
}

type tenant struct {
	tier   string
	limits map[string]limit.Override
}

// firstKey is where a key was first listed, to point at from a repeat,
// and what became of that listing, to undo it.
type firstKey struct {
	index, line int
	// applied says the listing is in the set, disabled whether as a
	// disabled key; dropped that a repeat has taken it out.
	applied, disabled, dropped bool
}

func (p *parser) file(root *yaml.Node) *Keys {
	f, ok := p.w.SecretMapping(root, "", fileKeys)
	if f == nil {
		return nil
	}
	p.fatal = !ok // an unknown top-level key may be a misspelt tenants
	if n, has := f["tenants"]; has {
		p.fatal = p.fatal || p.w.Resolve(n).Kind != yaml.MappingNode
		p.named(n, "tenants", "tenant names to their defaults", func(name string, k, v *yaml.Node, path string) {
			before := p.w.Problems()
			if len(name) > limit.MaxValueBytes {
				p.w.Addf(k, path, "the name is %d bytes, more than %d", len(name), limit.MaxValueBytes)
			}
			p.tenants[name] = p.tenant(v, path)
			if p.w.Problems() > before {
				p.badTenant(name, k.Line)
			}
		}, func(name string, k *yaml.Node, first int) {
			p.skipped++ // this listing
			if first > 0 {
				p.badTenant(name, first) // and the first, if still counted in
			}
		})
	}
	n, has := f["keys"]
	if !has {
		p.w.Addf(p.w.Resolve(root), "", "keys is required")
		return nil
	}
	list := p.w.Resolve(n)
	if list.Kind != yaml.SequenceNode {
		p.w.Addf(list, "keys", "want a list of keys, got %s", config.Shape(list))
		return nil
	}
	set := &keySet{byHash: make(map[[sha256.Size]byte]*entry, len(list.Content)), tenants: len(p.tenants)}
	defer func() { set.refs = p.refs }()
	seen := make(map[[sha256.Size]byte]firstKey, len(list.Content))
	for i, e := range list.Content {
		if p.w.Stopped() {
			break
		}
		path := fmt.Sprintf("keys[%d]", i)
		before := p.w.Problems()
		hash, hashed, id, disabled, good := p.key(e, path)
		bad := !good || p.w.Problems() > before
		if line, left := p.badTenants[id.Tenant]; left && !bad {
			if p.each {
				p.w.Addf(e, path, "left out with its tenant %s (line %d)", id.Tenant, line)
			}
			bad = true
		}
		if !hashed {
			p.skipped++
			continue
		}
		at := p.w.Resolve(e).Line
		if first, dup := seen[hash]; dup {
			if !bad {
				p.w.Addf(e, path, "the same key as keys[%d] at line %d; a key may be listed once", first.index, first.line)
			}
			p.skipped++
			if !first.dropped {
				p.drop(set, hash, first)
				first.dropped = true
				seen[hash] = first
			}
			continue
		}
		// A bad listing is remembered too, so that a good repeat of it
		// does not let the key in.
		seen[hash] = firstKey{index: i, line: at, applied: !bad, disabled: disabled}
		switch {
		case bad:
			p.skipped++
		case disabled:
			set.disabled++
		default:
			set.byHash[hash] = &entry{hash: hash, id: id}
		}
	}
	return &Keys{set: set}
}

// drop takes the first listing of a key listed again out of set.
func (p *parser) drop(set *keySet, hash [sha256.Size]byte, first firstKey) {
	if !first.applied {
		return // left out already, and counted
	}
	p.skipped++
	if first.disabled {
		set.disabled--
	} else {
		delete(set.byHash, hash)
	}
}

func (p *parser) tenant(n *yaml.Node, path string) tenant {
	var t tenant
	if isNull(p.w.Resolve(n)) {
		return t // a tenant named, without defaults
	}
	f, _ := p.w.SecretMapping(n, path, tenantKeys)
	if v, has := f["tier"]; has {
		t.tier = p.label(v, path+".tier")
		p.ref(RefTier, t.tier, v, path+".tier")
	}
	if v, has := f["limits"]; has {
		t.limits = p.limits(v, path+".limits")
	}
	return t
}

// key reads one entry of keys. hashed says hash is the key's, even when
// the entry has other problems.
func (p *parser) key(n *yaml.Node, path string) (hash [sha256.Size]byte, hashed bool, id Identity, disabled, ok bool) {
	f, ok := p.w.SecretMapping(n, path, keyKeys)
	if f == nil {
		return hash, false, id, false, false
	}
	at := p.w.Resolve(n)
	hn, hasHash := f["sha256"]
	kn, hasKey := f["key"]
	switch {
	case hasHash && hasKey:
		p.w.Addf(at, path, "both sha256 and key are set; give the key or its SHA-256, not both")
		ok = false
	case hasHash:
		s, good := p.w.Str(hn, path+".sha256")
		if good {
			// The decoder's error would quote the digit it choked on.
			b, err := hex.DecodeString(s)
			switch {
			case err == nil && (len(b) == md5Bytes || len(b) == sha1Bytes):
				// Another, weaker hash: it would never match, as only
				// the SHA-256 of a presented key is compared.
				p.w.Addf(hn, path+".sha256", "is %d hexadecimal digits, the length of %s; want the key's SHA-256 (64 digits: printf %%s \"$KEY\" | sha256sum)",
					2*len(b), map[int]string{md5Bytes: "an MD5", sha1Bytes: "a SHA-1"}[len(b)])
				good = false
			case err != nil || len(b) != sha256.Size:
				p.w.Addf(hn, path+".sha256", "want the key's SHA-256 as 64 hexadecimal digits")
				good = false
			case [sha256.Size]byte(b) == emptyHash:
				// Never a real key: a key the file lists must be at least
				// MinKeyBytes long, and no client presents an empty one.
				p.w.Addf(hn, path+".sha256", "is the SHA-256 of the empty string: hash the key itself (printf %%s \"$KEY\" | sha256sum, with the key set)")
				good = false
			}
			copy(hash[:], b)
			hashed = good
		}
		ok = ok && good
	case hasKey:
		s, good := p.w.Str(kn, path+".key")
		switch {
		case !good:
		case len(s) < MinKeyBytes:
			p.w.Addf(kn, path+".key", "is shorter than %d bytes, too easy to guess", MinKeyBytes)
			good = false
		case strings.Trim(s, " \t") != s:
			p.w.Addf(kn, path+".key", "begins or ends with a space or tab, which a presented key never does")
			good = false
		default:
			hash, hashed = sha256.Sum256([]byte(s)), true
		}
		ok = ok && good
	default:
		p.w.Addf(at, path, "sha256 or key is required")
		ok = false
	}

	var t tenant
	if v, has := f["tenant"]; !has {
		p.w.Addf(at, path, "tenant is required")
		ok = false
	} else {
		id.Tenant = p.label(v, path+".tenant")
		ok = ok && id.Tenant != ""
		t = p.tenants[id.Tenant] // a tenant without defaults need not be listed
	}
	id.Tier = t.tier
	if v, has := f["tier"]; has {
		id.Tier = p.label(v, path+".tier")
		p.ref(RefTier, id.Tier, v, path+".tier")
	}
	if v, has := f["name"]; has {
		id.KeyName = p.label(v, path+".name")
	}
	id.Overrides = t.limits
	if v, has := f["limits"]; has {
		id.Overrides = merge(p.limits(v, path+".limits"), t.limits)
	}
	if v, has := f["disabled"]; has {
		var good bool
		disabled, good = p.flag(v, path+".disabled")
		ok = ok && good
	}
	return hash, hashed, id, disabled, ok
}

// merge returns over with the entries of under it lacks, or under itself
// when over is empty.
func merge(over, under map[string]limit.Override) map[string]limit.Override {
	if len(over) == 0 {
		return under
	}
	for name, o := range under {
		if _, has := over[name]; !has {
			over[name] = o
		}
	}
	return over
}

// label reads a non-empty string short enough to be a descriptor value:
// a tenant, a tier or a key's name.
func (p *parser) label(n *yaml.Node, path string) string {
	s, _ := p.w.Name(n, path, limit.MaxValueBytes)
	return s
}

// limits reads a mapping from limit names to overrides.
func (p *parser) limits(n *yaml.Node, path string) map[string]limit.Override {
	out := map[string]limit.Override{}
	p.named(n, path, "limit names to {amount, unit, unit_multiplier}", func(name string, k, v *yaml.Node, path string) {
		p.ref(RefLimit, name, k, path)
		if o, ok := p.override(v, path); ok {
			out[name] = o
		}
	}, nil)
	if len(out) == 0 {
		return nil
	}
	return out
}

func (p *parser) override(n *yaml.Node, path string) (limit.Override, bool) {
	var o limit.Override
	f, ok := p.w.SecretMapping(n, path, overrideKeys)
	if f == nil {
		return o, false
	}
	if v, has := f["amount"]; !has {
		p.w.Addf(p.w.Resolve(n), path, "amount is required")
		ok = false
	} else {
		var good bool
		o.Amount, good = p.uint(v, path+".amount", 0, maxAmount)
		ok = ok && good
	}
	if v, has := f["unit"]; has {
		if s, good := p.w.Str(v, path+".unit"); good {
			if u, known := limit.ParseUnit(s); known {
				o.Unit, o.Multiplier = u, 1
			} else {
				p.w.Addf(v, path+".unit", "is not one of %s", limit.UnitNames())
				ok = false
			}
		} else {
			ok = false
		}
	}
	if v, has := f["unit_multiplier"]; has {
		m, good := p.uint(v, path+".unit_multiplier", 1, math.MaxUint32)
		if _, hasUnit := f["unit"]; good && !hasUnit {
			p.w.Addf(v, path+".unit_multiplier", "applies only with a unit; without one the rule's window is kept")
			good = false
		}
		good = good && p.w.FitsWindow(v, path+".unit_multiplier", m, o.Unit)
		if good && o.Unit != limit.UnitUnknown {
			o.Multiplier = uint32(m)
		}
		ok = ok && good
	}
	return o, ok
}

// named reads a mapping from names (any scalar, each once) to values, in
// file order, calling each with the name, its key and value nodes and the
// value's path. what says what the mapping holds, for the message when it
// is not a mapping. reject, when not nil, is called for a name refused
// (not a string, empty, or repeated), with the line of the name's first
// listing when it is a repeat, else 0.
func (p *parser) named(n *yaml.Node, path, what string, each func(name string, k, v *yaml.Node, path string), reject func(name string, k *yaml.Node, first int)) {
	m := p.w.Resolve(n)
	if m.Kind != yaml.MappingNode {
		p.w.Addf(m, path, "want a mapping of %s, got %s", what, config.Shape(m))
		return
	}
	lines := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content) && !p.w.Stopped(); i += 2 {
		k, v := p.w.Resolve(m.Content[i]), m.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.w.Addf(k, path, "a name must be a string, got %s", config.Shape(k))
			if reject != nil {
				reject("", k, 0)
			}
			continue
		}
		kp := path + "." + k.Value
		switch first, dup := lines[k.Value]; {
		case k.Value == "":
			p.w.Addf(k, path, "a name is empty")
			if reject != nil {
				reject("", k, 0)
			}
		case dup:
			p.w.Addf(k, kp, "repeated (first at line %d)", first)
			if reject != nil {
				reject(k.Value, k, first)
			}
		default:
			lines[k.Value] = k.Line
			each(k.Value, k, v, kp)
		}
	}
}

// uint reads a whole number in [lo, hi]. What is not a number at all is
// described by its kind: the walker would quote it.
func (p *parser) uint(n *yaml.Node, path string, lo, hi uint64) (uint64, bool) {
	if r := p.w.Resolve(n); r.Kind != yaml.ScalarNode || (r.ShortTag() != "!!int" && r.ShortTag() != "!!float") {
		p.w.Addf(r, path, "want a whole number, got %s", config.Shape(r))
		return 0, false
	}
	return p.w.Uint(n, path, lo, hi)
}

// flag reads true or false. Unlike rule files, which follow yaml.v2 for
// envoyproxy/ratelimit's sake, a keys file is new: YAML 1.2 booleans only.
func (p *parser) flag(n *yaml.Node, path string) (bool, bool) {
	r := p.w.Resolve(n)
	var b bool
	if r.Kind != yaml.ScalarNode || r.ShortTag() != "!!bool" || r.Decode(&b) != nil {
		p.w.Addf(r, path, "want true or false, got %s", config.Shape(r))
		return false, false
	}
	return b, true
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}
