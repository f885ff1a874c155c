// Package dashboards checks deploy/: that the Grafana dashboard and the
// Prometheus alert rules parse, and that every metric they use is one a
// running tollgate exports.
package dashboards

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// promqlKeywords are identifiers that are never metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
}

// aggregations may be followed by "by (...)" before their '(', so they are
// known by name.
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// labelListKeywords are followed by a parenthesized list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdent(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// MetricNames returns the metric names expr selects, in order of first
// use: every identifier that is not a function or aggregation (followed
// by '('), a keyword, a label (inside {}, or the list after by, on, ...),
// a string, a number or duration, or a Grafana variable ($x, ${x}).
func MetricNames(expr string) ([]string, error) {
	var out []string
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{' || c == '[':
			j, err := skipGroup(expr, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '$':
			i++
			if i < len(expr) && expr[i] == '{' {
				for i < len(expr) && expr[i] != '}' {
					i++
				}
				i++
				continue
			}
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && (expr[k] == ' ' || expr[k] == '\n' || expr[k] == '\t' || expr[k] == '\r') {
				k++
			}
			switch {
			case labelListKeywords[word]:
				if k < len(expr) && expr[k] == '(' {
					end := strings.IndexByte(expr[k:], ')')
					if end < 0 {
						return nil, fmt.Errorf("unclosed label list after %q", word)
					}
					j = k + end + 1
				}
			case promqlKeywords[word], aggregations[word]:
			case k < len(expr) && expr[k] == '(':
				// A function or an aggregation.
			default:
				if !slices.Contains(out, word) {
					out = append(out, word)
				}
			}
			i = j
		default:
			i++
		}
	}
	return out, nil
}

// skipString returns the index after the string literal starting at i.
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if q != '`' {
				j++
			}
		case q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d", i)
}

// skipGroup returns the index after the {...} or [...] starting at i,
// stepping over strings inside it.
func skipGroup(s string, i int) (int, error) {
	closer := byte('}')
	if s[i] == '[' {
		closer = ']'
	}
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '"', '\'', '`':
			k, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = k - 1
		case closer:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed %q at %d", s[i], i)
}

// Query is one PromQL expression and where it comes from.
type Query struct {
	Where string
	Expr  string
}

var labelValues = regexp.MustCompile(`^\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)

// DashboardQueries returns every PromQL expression of a Grafana dashboard:
// each panel target's expr (rows' nested panels too) and, for each query
// variable, the metric its label_values(...) reads as a selector.
func DashboardQueries(data []byte) ([]Query, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("parse dashboard: %w", err)
	}
	var out []Query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Query{Where: fmt.Sprintf("panel %q target %s", p.Title, t.RefID), Expr: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				return nil, fmt.Errorf("variable %q: query is neither a string nor {query}", v.Name)
			}
			q = obj.Query
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			return nil, fmt.Errorf("variable %q: %q is not label_values(metric, label)", v.Name, q)
		}
		out = append(out, Query{Where: fmt.Sprintf("variable %q", v.Name), Expr: m[1]})
	}
	return out, nil
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// AlertQueries returns every rule's expression in a Prometheus rules file.
func AlertQueries(data []byte) ([]Query, error) {
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse rules: %w", err)
	}
	var out []Query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, Query{Where: fmt.Sprintf("group %q rule %q", g.Name, r.Alert+r.Record), Expr: r.Expr})
		}
	}
	return out, nil
}

// Exported is what one scrape of /metrics showed: sample names, and the
// families of # TYPE lines (a histogram's family is the name without
// _bucket, _sum and _count).
type Exported struct {
	Samples, Families map[string]bool
}

// ParseExposition reads Prometheus text exposition.
func ParseExposition(text string) Exported {
	e := Exported{Samples: map[string]bool{}, Families: map[string]bool{}}
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if name, _, ok := strings.Cut(rest, " "); ok {
				e.Families[name] = true
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end > 0 {
			e.Samples[line[:end]] = true
		}
	}
	return e
}

// Has reports whether name is exported with at least one sample (a
// family name counts when its samples carry a suffix, as a histogram's do).
func (e Exported) Has(name string) bool {
	if e.Samples[name] {
		return true
	}
	if !e.Families[name] {
		return false
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if e.Samples[name+suffix] {
			return true
		}
	}
	return false
}

// Missing returns "where: name" for each metric queries use that e lacks.
func Missing(queries []Query, e Exported) ([]string, error) {
	var out []string
	for _, q := range queries {
		names, err := MetricNames(q.Expr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", q.Where, err)
		}
		for _, n := range names {
			if !e.Has(n) {
				out = append(out, fmt.Sprintf("%s: %s", q.Where, n))
			}
		}
	}
	return out, nil
}
