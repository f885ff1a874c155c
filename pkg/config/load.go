package config

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/pkg/limit"
)

// Load reads a rule file, or every *.yaml and *.yml file in a directory,
// one domain per file, and compiles them into a RuleSet. Domain.Source is
// each file's path.
//
// A directory is read without recursing, and names starting with a dot
// are skipped: a Kubernetes ConfigMap volume holds its data in hidden
// ..data and ..2026_... entries and presents each key as a symlink such as
// rules.yaml -> ..data/rules.yaml, which Load follows. A directory with no
// rule file is an error, since it is far more likely a wrong mount than a
// wish for no limits.
//
// Bad rules yield an Errors listing every problem in every file; a file
// that cannot be read yields a wrapped I/O error.
func Load(path string) (*limit.RuleSet, error) {
	files, err := readRules(path)
	if err != nil {
		return nil, err
	}
	return compile(files)
}

type ruleFile struct {
	path string
	data []byte
}

func readRules(path string) ([]ruleFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load rules %q: %w", path, err)
	}
	if !fi.IsDir() {
		data, err := ReadCapped(path)
		if err != nil {
			return nil, fmt.Errorf("load rules %q: %w", path, err)
		}
		return []ruleFile{{path: path, data: data}}, nil
	}
	entries, err := os.ReadDir(path) // sorted by name, so errors come in a stable order
	if err != nil {
		return nil, fmt.Errorf("load rules %q: %w", path, err)
	}
	var files []ruleFile
	for _, e := range entries {
		name := e.Name()
		ext := strings.ToLower(filepath.Ext(name))
		if strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		p := filepath.Join(path, name)
		fi, err := os.Stat(p) // follows the ConfigMap's symlinks
		if err != nil {
			return nil, fmt.Errorf("load rules %q: %w", path, err)
		}
		if fi.IsDir() {
			continue
		}
		data, err := ReadCapped(p)
		if err != nil {
			return nil, fmt.Errorf("load rules %q: %w", path, err)
		}
		files = append(files, ruleFile{path: p, data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("load rules %q: no *.yaml or *.yml file in the directory", path)
	}
	return files, nil
}

// ReadCapped reads at most one byte more than MaxFileBytes from the file
// at path, which is enough for a parser to reject a file too large
// without reading it whole. Every file an operator writes (rules, keys,
// the authz config) is read through it.
func ReadCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // opened read-only: a close error loses nothing
	return io.ReadAll(io.LimitReader(f, maxFileBytes+1))
}

func compile(files []ruleFile) (*limit.RuleSet, error) {
	var problems Errors
	domains := make([]*limit.Domain, 0, len(files))
	owner := map[string]string{} // domain -> the file that defined it first
	for _, f := range files {
		d, line, err := parse(f.path, f.data)
		if err != nil {
			var e Errors
			if !errors.As(err, &e) {
				return nil, err
			}
			problems = append(problems, e...)
			continue
		}
		if prev, dup := owner[d.Name]; dup {
			problems = append(problems, Problem{File: f.path, Line: line, Path: "domain",
				Msg: fmt.Sprintf("%q is already the domain of %s; a domain lives in one file", d.Name, prev)})
			continue
		}
		owner[d.Name] = f.path
		domains = append(domains, d)
	}
	if len(problems) > 0 {
		return nil, problems
	}
	rs, err := limit.NewRuleSet(domains...)
	if err != nil {
		// Parse checks everything NewRuleSet does; reaching this is a bug here.
		return nil, fmt.Errorf("index rules: %w", err)
	}
	return rs, nil
}

// fingerprint identifies what readRules saw, so Watch reports a change
// only when the rules' bytes (or the read error) changed.
func fingerprint(files []ruleFile, err error) [sha256.Size]byte {
	h := sha256.New()
	if err != nil {
		io.WriteString(h, "error\x00"+err.Error())
	}
	for _, f := range files {
		// Lengths first, so no two different lists hash the same bytes.
		io.WriteString(h, strconv.Itoa(len(f.path))+":"+f.path+strconv.Itoa(len(f.data))+":")
		h.Write(f.data)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
