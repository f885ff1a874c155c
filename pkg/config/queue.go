package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// The keys of queue: and of each of its tiers.
var (
	queueKeys     = []string{"max_wait", "max_length", "poll", "tiers"}
	queueTierKeys = []string{"tier", "max_wait", "max_length", "skip"}
)

// queue reads the file's queue (docs/admission-queue.md):
//
//	queue:                             # (Optional) refused requests wait for capacity; default none
//	  max_wait: 2s                     #   (Optional) bound of tiers not listed (all requests without tiers); default 0 (no wait)
//	  max_length: 100                  #   (Required with max_wait) waiters of one such tier per replica
//	  poll: 250ms                      #   (Optional) retry this often when no release is seen, 10ms..30s; default 250ms
//	  tiers:                           #   (Optional; needs tiers) highest priority first
//	    - tier: premium                #     (Required) a plan of tiers; once
//	      max_wait: 4s                 #     (Required unless skip) longest wait, in (0,30s]
//	      max_length: 200              #     (Required unless skip) waiters of the tier per replica, 1..100000
//	      skip: false                  #     (Optional) never wait: answered at once; default false
//
// It returns nil when anything is wrong, after reporting it.
func (w *walker) queue(n *yaml.Node, tiers *limit.Tiers, hasTiers bool) *limit.Queue {
	const path = "queue"
	before := len(w.problems)
	f, _ := w.mapping(n, path, queueKeys)
	if f == nil {
		return nil
	}
	n = w.resolve(n)
	q := &limit.Queue{}
	q.Default = w.queueBound(f, n, path, false)
	if v, has := f["poll"]; has {
		if d, ok := w.duration(v, path+".poll"); ok {
			if d < 10*time.Millisecond || d > limit.MaxQueueWait {
				w.addf(v, path+".poll", "%s is outside 10ms..%s", d, limit.MaxQueueWait)
			}
			q.Poll = d
		}
	}
	if v, has := f["tiers"]; has {
		if !hasTiers {
			w.addf(v, path+".tiers", "needs the file's tiers: it orders their plans")
		} else {
			q.Tiers = w.queueTiers(v, path+".tiers", tiers)
		}
	}
	if len(w.problems) != before {
		return nil
	}
	if q.MaxWait() == 0 {
		w.addf(n, path, "no tier may wait: set max_wait here or on a tier")
		return nil
	}
	return q
}

// queueTiers reads queue.tiers, in priority order.
func (w *walker) queueTiers(n *yaml.Node, path string, tiers *limit.Tiers) []limit.QueueTier {
	n = w.resolve(n)
	if n.Kind != yaml.SequenceNode {
		w.addf(n, path, "want a list of tiers, highest priority first, got %s", describe(n))
		return nil
	}
	out := make([]limit.QueueTier, 0, len(n.Content))
	lines := map[string]int{}
	for i, c := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		f, _ := w.mapping(c, p, queueTierKeys)
		if f == nil {
			continue
		}
		c = w.resolve(c)
		skip := w.flag(f, "skip", p)
		t := w.queueBound(f, c, p, !skip)
		t.Skip = skip
		if v, has := f["tier"]; !has {
			w.addf(c, p, "tier is required")
		} else if name, ok := w.str(v, p+".tier"); ok {
			switch first, dup := lines[name]; {
			case dup:
				w.addf(v, p+".tier", "%q is listed already (line %d)", name, first)
			case tiers != nil && !hasPlan(tiers, name):
				w.addf(v, p+".tier", "%q is not one of the plans (%s)", name, strings.Join(planNames(tiers), "|"))
			}
			lines[name] = w.resolve(v).Line
			t.Tier = name
		}
		out = append(out, t)
	}
	return out
}

// queueBound reads max_wait and max_length of f (at n, path); required:
// both must be there.
func (w *walker) queueBound(f map[string]*yaml.Node, n *yaml.Node, path string, required bool) limit.QueueTier {
	var t limit.QueueTier
	v, has := f["max_wait"]
	if has {
		if d, ok := w.duration(v, path+".max_wait"); ok {
			if d <= 0 || d > limit.MaxQueueWait {
				w.addf(v, path+".max_wait", "%s is outside (0,%s]", d, limit.MaxQueueWait)
			}
			t.MaxWait = d
		}
	}
	l, hasLength := f["max_length"]
	if hasLength {
		m, _ := w.uint(l, path+".max_length", 1, limit.MaxQueueLength)
		t.MaxLength = int(m)
	}
	switch {
	case required && !has:
		w.addf(n, path, "max_wait is required")
	case (required || has) && !hasLength:
		w.addf(n, path, "max_length is required with max_wait: no queue is unbounded")
	case hasLength && !has:
		w.addf(l, path+".max_length", "max_length needs max_wait")
	}
	return t
}

// hasPlan tells whether name is one of t's plans.
func hasPlan(t *limit.Tiers, name string) bool {
	_, ok := t.Plans[name]
	return ok
}

// planNames are t's plans, sorted, for messages.
func planNames(t *limit.Tiers) []string {
	out := make([]string, 0, len(t.Plans))
	for k := range t.Plans {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
