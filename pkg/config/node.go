package config

import (
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// MaxFileBytes is the most a file read through a Walker may hold.
const MaxFileBytes = maxFileBytes

// Walker is the rule parser's strict walk over a YAML file, for the other
// files an operator writes (pkg/authn's keys file), so that they are held
// to the same rules and report problems the same way: unknown and repeated
// keys are errors, aliases are charged to a budget so a small file cannot
// expand into a huge tree, and every problem is a Problem naming the file,
// the line and the path, up to 50 of them.
//
// Paths are built by the caller: a key's path is its parent's path, a dot
// and the key (descriptors[1].rate_limit), and a list item's is its
// parent's with the index (descriptors[1]).
type Walker struct {
	w walker
}

// NewWalker returns a Walker whose problems name file.
func NewWalker(file string) *Walker {
	return &Walker{w: walker{file: file}}
}

// Document parses data as exactly one YAML document and returns its
// top-level node, or nil after reporting why there is none: the file is
// larger than MaxFileBytes, it is not YAML, it holds a second document,
// or it holds none, which is reported with the message empty.
func (w *Walker) Document(data []byte, empty string) *yaml.Node {
	root := w.w.document(data, docWords{most: "the most it may hold", empty: empty, one: "the file holds one document"})
	if len(w.w.problems) > 0 {
		return nil // unlike a rule file's, a second document stops the walk
	}
	return root
}

// Resolve follows aliases and charges the node to the walk's budget; call
// it on every node before looking at its Kind.
func (w *Walker) Resolve(n *yaml.Node) *yaml.Node { return w.w.resolve(n) }

// Mapping checks that n is a mapping whose keys are all in allowed, each
// once, and returns the value of each key, leaving out keys whose value
// is null. ok is false when it reported a problem.
func (w *Walker) Mapping(n *yaml.Node, path string, allowed []string) (f map[string]*yaml.Node, ok bool) {
	return w.w.mapping(n, path, allowed)
}

// SecretMapping is Mapping for a mapping that may hold a secret, such as
// an API key's entry: its problems never quote the file. Mapping quotes
// what it found where it wanted a mapping, and the name of a key it does
// not know, and either may be a secret written in the wrong place; here
// the first is described by its kind only, and the second is left out of
// the path, the line being enough to find it.
func (w *Walker) SecretMapping(n *yaml.Node, path string, allowed []string) (f map[string]*yaml.Node, ok bool) {
	r := w.w.resolve(n)
	if r.Kind != yaml.MappingNode {
		w.w.addf(r, path, "want a mapping with keys %s, got %s", strings.Join(allowed, "|"), Shape(r))
		return nil, false
	}
	before := len(w.w.problems)
	f, ok = w.w.mapping(r, path, allowed)
	prefix := join(path, "")
	for i := before; i < len(w.w.problems); i++ {
		p := &w.w.problems[i]
		if key, under := strings.CutPrefix(p.Path, prefix); under && !slices.Contains(allowed, key) {
			p.Path = path
		}
	}
	return f, ok
}

// Str reads any scalar as the text written (value: 200 is "200"); null is
// "". Anything else is a problem.
func (w *Walker) Str(n *yaml.Node, path string) (string, bool) { return w.w.str(n, path) }

// Name reads a non-empty string of at most max bytes, such as a domain,
// a descriptor key or a tenant, with the rule files' words for one that
// is empty ("is empty") or too long ("is N bytes, more than max").
func (w *Walker) Name(n *yaml.Node, path string, max int) (string, bool) {
	return w.w.name(n, path, max)
}

// FitsWindow reports, at n, a unit_multiplier m that makes a window of m
// units longer than the longest one, in the rule files' words, and says
// whether m fits.
func (w *Walker) FitsWindow(n *yaml.Node, path string, m uint64, unit limit.Unit) bool {
	return w.w.fitsWindow(n, path, m, unit)
}

// Flag reads the optional boolean key of f (a Mapping result); absent is
// false. YAML 1.1's yes, no, on and off are accepted, unquoted.
func (w *Walker) Flag(f map[string]*yaml.Node, key, path string) bool { return w.w.flag(f, key, path) }

// Uint reads a whole number in [lo, hi].
func (w *Walker) Uint(n *yaml.Node, path string, lo, hi uint64) (uint64, bool) {
	return w.w.uint(n, path, lo, hi)
}

// Addf reports a problem at n's line (none when n is nil).
func (w *Walker) Addf(n *yaml.Node, path, format string, args ...any) {
	w.w.addf(n, path, format, args...)
}

// Stopped says whether the walk gave up (too many problems, or aliases
// that expand too far): a caller looping over a list should stop too.
func (w *Walker) Stopped() bool { return w.w.stopped }

// Problems is how many problems have been reported so far, so that a
// caller can tell which part of a file a problem came from.
func (w *Walker) Problems() int { return len(w.w.problems) }

// Err returns every problem reported, sorted by line, as an Errors; nil
// when there are none.
func (w *Walker) Err() error { return w.w.err() }

// Shape names n's kind for a "want X, got Y" message without quoting its
// value, for files that may hold secrets.
func Shape(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing (null)"
		case "!!str", "!!binary":
			return "a string"
		case "!!int", "!!float":
			return "a number"
		case "!!bool":
			return "a boolean"
		}
		return "a scalar"
	}
	return "an alias to nothing"
}
