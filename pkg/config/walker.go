package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// walker walks a parsed file and collects problems as it goes, so one
// pass reports them all.
type walker struct {
	file      string
	problems  Errors
	truncated bool
	budget    int // node visits left
	visits    int
	stopped   bool
	// alg is the file's default algorithm.
	alg limit.Algorithm
	// tierKey is tiers.key, which no rule may match on.
	tierKey string
	// warnings are what the file says that loads but is ignored or
	// read leniently, as envoyproxy/ratelimit reads it (warnf).
	warnings []string
}

// warnf records a warning at n: file:line: path: warning: message.
func (w *walker) warnf(n *yaml.Node, path, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	w.warnings = append(w.warnings, fmt.Sprintf("%s:%d: %s: warning: %s", w.file, line, path, fmt.Sprintf(format, args...)))
}

func (w *walker) addf(n *yaml.Node, path, format string, args ...any) {
	if w.stopped {
		return
	}
	if len(w.problems) == maxProblems {
		w.truncated, w.stopped = true, true
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	w.problems = append(w.problems, Problem{File: w.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (w *walker) err() error {
	if len(w.problems) == 0 {
		return nil
	}
	// Aliases make the walk jump around the file; people read top down.
	sort.SliceStable(w.problems, func(i, j int) bool { return w.problems[i].Line < w.problems[j].Line })
	if w.truncated {
		w.problems = append(w.problems, Problem{File: w.file, Msg: fmt.Sprintf("stopped after the first %d problems", maxProblems)})
	}
	return w.problems
}

// docWords are the words a file kind's messages about the file as a
// whole use: the rule parser's and the Walker's differ.
type docWords struct {
	// most ends "file is larger than 4 MiB, ..."
	most string
	// empty is the whole message for a file with no document.
	empty string
	// one ends "a second YAML document; ..."
	one string
}

// document parses data as exactly one YAML document and returns its
// top-level node, or nil after reporting why there is none: the file is
// larger than maxFileBytes, it is not YAML, or it holds no document. It
// sets the walk's budget from data's length.
//
// A second document, or a syntax error after the first, is reported and
// the first document is still returned, so that one pass also reports
// the first one's problems; a caller that must not read on compares
// problems before and after.
func (w *walker) document(data []byte, words docWords) *yaml.Node {
	if len(data) > maxFileBytes {
		w.addf(nil, "", "file is larger than %d MiB, %s", maxFileBytes>>20, words.most)
		return nil
	}
	w.budget = len(data) + extraVisits
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		w.syntax(err)
		return nil
	}
	for {
		// Empty documents, as after a trailing ---, are harmless.
		var extra yaml.Node
		err := dec.Decode(&extra)
		if err == nil && (len(extra.Content) == 0 || isNull(extra.Content[0])) {
			continue
		}
		if err == nil {
			w.addf(&extra, "", "a second YAML document; %s", words.one)
		} else if !errors.Is(err, io.EOF) {
			w.syntax(err)
		}
		break
	}
	if len(doc.Content) == 0 || isNull(doc.Content[0]) {
		w.addf(&yaml.Node{Line: 1}, "", "%s", words.empty)
		return nil
	}
	return doc.Content[0]
}

// syntax reports a YAML parser error, moving yaml.v3's "yaml: line N:"
// prefix into the Problem's line.
func (w *walker) syntax(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.Index(rest, ": "); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				line, msg = n, rest[i+2:]
			}
		}
	}
	w.addf(&yaml.Node{Line: line}, "", "invalid YAML: %s", msg)
}

// resolve follows aliases and charges the node to the walk's budget.
func (w *walker) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	w.budget--
	if w.budget == 0 {
		w.addf(n, "", "aliases expand the file too far; stopped after %d YAML nodes", w.visits)
		w.stopped = true
	}
	w.visits++
	return n
}

// mapping checks that n is a mapping whose keys are all in allowed and
// appear once, and returns the value of each key. Keys whose value is
// null are left out: envoyproxy/ratelimit's yaml.v2 reads "key:" with
// nothing after it as the key's zero value.
func (w *walker) mapping(n *yaml.Node, path string, allowed []string) (map[string]*yaml.Node, bool) {
	n = w.resolve(n)
	if n.Kind != yaml.MappingNode {
		w.addf(n, path, "want a mapping with keys %s, got %s", strings.Join(allowed, "|"), describe(n))
		return nil, false
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	ok := true
	for i := 0; i+1 < len(n.Content) && !w.stopped; i += 2 {
		k, v := w.resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			w.addf(k, path, "a key must be a string, got %s", describe(k))
			ok = false
			continue
		}
		p := join(path, k.Value)
		if !slices.Contains(allowed, k.Value) {
			switch guess := closest(k.Value, allowed); {
			case k.Value == "replaces":
				w.addf(k, p, "unknown key here; replaces goes inside rate_limit, as in envoyproxy/ratelimit")
			case guess != "":
				w.addf(k, p, "unknown key; did you mean %s?", guess)
			default:
				w.addf(k, p, "unknown key (want one of %s)", strings.Join(allowed, "|"))
			}
			ok = false
			continue
		}
		if first, dup := lines[k.Value]; dup {
			w.addf(k, p, "key repeated (first at line %d)", first)
			ok = false
			continue
		}
		lines[k.Value] = k.Line
		if !isNull(w.resolve(v)) {
			out[k.Value] = v
		}
	}
	return out, ok
}

// str reads any scalar as the text written, as envoyproxy/ratelimit's
// yaml.v2 does for string fields: value: 200 is "200".
func (w *walker) str(n *yaml.Node, path string) (string, bool) {
	n = w.resolve(n)
	if n.Kind != yaml.ScalarNode {
		w.addf(n, path, "want a string, got %s", describe(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// name reads a non-empty string of at most max bytes: a domain, a
// descriptor key, a tenant. Every file kind checks its names here, so
// they are refused with the same words. ok is false after a problem.
func (w *walker) name(n *yaml.Node, path string, max int) (string, bool) {
	s, ok := w.str(n, path)
	switch {
	case !ok:
		return "", false
	case s == "":
		w.addf(n, path, "is empty")
		return "", false
	case len(s) > max:
		w.addf(n, path, "is %d bytes, more than %d", len(s), max)
		return "", false
	}
	return s, true
}

// fitsWindow reports, at n, a unit_multiplier m that makes a window of m
// units longer than the longest one, and says whether m fits: a window
// is a time.Duration, int64 nanoseconds. An unknown unit fits anything.
func (w *walker) fitsWindow(n *yaml.Node, path string, m uint64, unit limit.Unit) bool {
	if u := int64(unit.Duration()); u > 0 && m > uint64(math.MaxInt64/u) {
		w.addf(n, path, "%d %ss is longer than the longest window, %d %ss", m, unit, math.MaxInt64/u, unit)
		return false
	}
	return true
}

// flag reads an optional boolean key of f; absent is false.
func (w *walker) flag(f map[string]*yaml.Node, key, path string) bool {
	v, has := f[key]
	if !has {
		return false
	}
	n := w.resolve(v)
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return b
			}
		case "!!str":
			// yaml.v2, which envoyproxy/ratelimit uses, reads YAML 1.1's
			// words as booleans, so its files may say yes and off.
			if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
				switch n.Value {
				case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
					return true
				case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
					return false
				}
			}
		}
	}
	w.addf(n, join(path, key), "want true or false, got %s", describe(n))
	return false
}

// uint reads a whole number in [lo, hi].
func (w *walker) uint(n *yaml.Node, path string, lo, hi uint64) (uint64, bool) {
	n = w.resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && isDigits(n.Value) {
			w.addf(n, path, "%s is more than %d", n.Value, hi)
		} else {
			w.addf(n, path, "want a whole number, got %s", describe(n))
		}
		return 0, false
	}
	if strings.HasPrefix(n.Value, "-") {
		var i int64
		if n.Decode(&i) != nil || i != 0 {
			w.addf(n, path, "%s is negative", n.Value)
			return 0, false
		}
	}
	var u uint64
	if err := n.Decode(&u); err != nil || u > hi {
		w.addf(n, path, "%s is more than %d", n.Value, hi)
		return 0, false
	}
	if u < lo {
		w.addf(n, path, "%s is less than %d", n.Value, lo)
		return 0, false
	}
	return u, true
}

// closest returns the word in words nearest to s, if it is near enough
// to be the likely intent (a typo, a missing or extra letter).
// Closest is the word of words nearest s by edit distance, when one is
// near enough to be a likely typo of it (at most 2 edits); "" otherwise.
func Closest(s string, words []string) string { return closest(s, words) }

func closest(s string, words []string) string {
	best, bestD := "", 3
	for _, w := range words {
		if d := distance(s, w); d < bestD {
			best, bestD = w, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func isDigits(s string) bool {
	s = strings.TrimPrefix(s, "+")
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// describe names a node for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!null":
			return "nothing (null)"
		default:
			return n.Value
		}
	}
	return "an alias to nothing"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// fields remembers the node of each path read under one value, so that
// the problems its Check reports point at their line.
type fields map[string]*yaml.Node

// report adds each of problems, found in the value read at base from
// node n, at the line of its field (or of its nearest parent read).
func (w *walker) report(n *yaml.Node, base string, at fields, problems []limit.FieldError) {
	for _, p := range problems {
		node, path := n, p.Path
		for q := path; q != ""; {
			if v, ok := at[q]; ok {
				node = v
				break
			}
			i := strings.LastIndexAny(q, ".[")
			if i < 0 {
				break
			}
			q = q[:i]
		}
		w.addf(node, join(base, path), "%s", p.Msg)
	}
}

// float reads a finite number.
func (w *walker) float(n *yaml.Node, path string) (float64, bool) {
	n = w.resolve(n)
	var v float64
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") || n.Decode(&v) != nil ||
		math.IsNaN(v) || math.IsInf(v, 0) {
		w.addf(n, path, "want a number such as 0.7, got %s", describe(n))
		return 0, false
	}
	return v, true
}

// duration reads a Go duration such as 30s or 1m.
func (w *walker) duration(n *yaml.Node, path string) (time.Duration, bool) {
	s, ok := w.str(n, path)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		w.addf(n, path, "%q is not a duration such as 30s or 10m", s)
		return 0, false
	}
	return d, true
}
