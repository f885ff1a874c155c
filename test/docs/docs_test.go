package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// module is the main module's path: a backticked import path under it
// names a directory of the repository.
const module = "github.com/tollgate-dev/tollgate"

// TestRepository checks every Markdown file of the repository.
func TestRepository(t *testing.T) {
	t.Parallel()
	files, problems, err := check(os.DirFS("../.."))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "docs/README.md", "docs/authz.md", "istio/README.md", "charts/tollgate/README.md"} {
		if !slices.Contains(files, want) {
			t.Errorf("%s was not checked; checked %d files", want, len(files))
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestIndex: docs/README.md, the docs' index, links every page of docs/
// and the READMEs of istio/ and charts/, so a new page cannot be left out
// of it.
func TestIndex(t *testing.T) {
	t.Parallel()
	const index = "docs/README.md"
	r, err := newRepo(os.DirFS("../.."))
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.page(index)
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, l := range p.links {
		file, _, _ := strings.Cut(l.text, "#")
		if file != "" && !scheme.MatchString(file) {
			linked[path.Join(path.Dir(index), file)] = true
		}
	}
	files, err := r.markdown()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if (strings.HasPrefix(f, "docs/") || f == "istio/README.md" || strings.HasPrefix(f, "charts/")) && f != index && !linked[f] {
			t.Errorf("%s does not link %s", index, f)
		}
	}
}

// TestCheck shows each check failing on a small tree, and passing what
// GitHub renders as a working link.
func TestCheck(t *testing.T) {
	t.Parallel()
	base := fstest.MapFS{
		".gitignore":            {Data: []byte("/bin/\n*.test\n")},
		"Makefile":              {Data: []byte("GO ?= go\nLDFLAGS := -X x\n.PHONY: run\nrun: build ## Serve.\n\t$(GO) run .\nbuild:\n\t$(GO) build\n$(BIN)/helm:\n\tinstall\n")},
		"README.md":             {Data: []byte("# Tollgate\n\n## Fresh machine\n\n```sh\n## not a heading\n```\n\n## Fresh machine\n")},
		"docs/a.md":             {Data: []byte("# A: the `x_y` API, [linked](../README.md) (issue 12) #\n\n### Ünïcode & more\n")},
		"docs/img/plot.png":     {Data: []byte("png")},
		"bin/notes.md":          {Data: []byte("[not read](missing.md)")},
		"pkg/authn/keys.go":     {Data: []byte("package authn\n")},
		"config/inference.yaml": {Data: []byte("domain: inference\n")},
	}
	tests := []struct {
		name string
		give string // docs/x.md
		want []string
	}{
		{name: "relative link", give: "see [a](a.md) and [the README](../README.md)"},
		{name: "link from the root", give: "[a](/docs/a.md)"},
		{name: "anchor", give: "[m](../README.md#fresh-machine)"},
		{name: "anchor of a repeated heading", give: "[m](../README.md#fresh-machine-1)"},
		{name: "anchor of a heading with code, a link and punctuation", give: "[a](a.md#a-the-x_y-api-linked-issue-12)"},
		{name: "anchor of a heading with letters beyond ASCII", give: "[a](a.md#ünïcode--more)"},
		{name: "anchor in this file", give: "# Here we are\n\n[h](#here-we-are)"},
		{name: "image", give: "![plot](a.md)"},
		{name: "link title", give: `[a](a.md "the A doc")`},
		{name: "directory", give: "[pkg](../pkg/authn/)"},
		{name: "reference definition", give: "[a][1]\n\n[1]: a.md"},
		{name: "external links are not fetched", give: "[g](https://example.com/missing.md) [m](mailto:x@example.com)"},
		{name: "a link in code is text", give: "`[a](missing.md)`\n\n```\n[a](missing.md)\n```"},
		{name: "a link with a percent escape", give: "[a](%61.md)"},
		{
			name: "broken link",
			give: "first line\n\nsee [b](b.md)",
			want: []string{"docs/x.md:3: link to docs/b.md: no such file or directory"},
		},
		{
			name: "broken link on a later line of a paragraph",
			give: "a [link\nover lines](\nnothing.md)",
			want: []string{"docs/x.md:3: link to docs/nothing.md: no such file or directory"},
		},
		{
			name: "broken reference definition",
			give: "[a][1]\n\n[1]: c.md",
			want: []string{"docs/x.md:3: link to docs/c.md: no such file or directory"},
		},
		{
			name: "broken anchor",
			give: "[a](a.md#a-the-x-api)",
			want: []string{"docs/x.md:1: link to docs/a.md#a-the-x-api: docs/a.md has no such heading"},
		},
		{
			name: "an anchor is not a heading inside a code block",
			give: "[n](../README.md#not-a-heading)",
			want: []string{"docs/x.md:1: link to README.md#not-a-heading: README.md has no such heading"},
		},
		{
			name: "broken anchor in this file",
			give: "# Here\n\n[h](#there)",
			want: []string{"docs/x.md:3: link to docs/x.md#there: docs/x.md has no such heading"},
		},
		{
			name: "link out of the repository",
			give: "[o](../../outside.md)",
			want: []string{"docs/x.md:1: link to ../../outside.md leaves the repository"},
		},
		{
			name: "paths that exist",
			give: "`pkg/authn/keys.go`, `config/inference.yaml:1`, `./pkg/authn/...`, `" + module + "/pkg/authn`, `config/*.yaml`, `docs/a.md#ünïcode--more`, `config/`",
		},
		{
			name: "not paths",
			give: "`application/json`, `x-ratelimit-*`, `/v1/pressure`, `tg:{a}:b`, `requests/s`, `ghcr.io/x/y:1`, `a b/c.go`, `" + module + "`",
		},
		{name: "generated paths are not checked", give: "`bin/tollgate-image.tar`"},
		{name: "a path beside the file", give: "`img/plot.png`"},
		{
			name: "missing path beside the file",
			give: "`img/plot.svg`",
			want: []string{"docs/x.md:1: `img/plot.svg`: no such file or directory"},
		},
		{
			name: "missing path",
			give: "`pkg/authn/missing.go` and `pkg/nothing/`",
			want: []string{
				"docs/x.md:1: `pkg/authn/missing.go`: no such file or directory",
				"docs/x.md:1: `pkg/nothing/`: no such file or directory",
			},
		},
		{
			name: "make in a code span over two lines",
			give: "x\n`make\ndeploy`",
			want: []string{"docs/x.md:2: make deploy: no such target in the Makefile"},
		},
		{
			name: "missing import path",
			give: "`" + module + "/pkg/gone`",
			want: []string{"docs/x.md:1: `" + module + "/pkg/gone`: no such file or directory"},
		},
		{
			name: "glob that matches nothing",
			give: "`config/*.json`",
			want: []string{"docs/x.md:1: `config/*.json`: no file matches"},
		},
		{
			name: "missing anchor of a path",
			give: "`docs/a.md#b`",
			want: []string{"docs/x.md:1: `docs/a.md#b`: docs/a.md has no such heading"},
		},
		{name: "make targets", give: "`make run`, `make build run GO=go1.26`, `make run X='a b' ARGS=\"--x 1\" build`\n\n```sh\nmake run ARGS=\"--x 1\"\n$ make build && make nothing\n```"},
		{name: "a quoted value is one word", give: "`make run ARGS=\"--x tset\" tset`", want: []string{"docs/x.md:1: make tset: no such target in the Makefile"}},
		{
			name: "unknown make target",
			give: "`make deploy`\n\n```sh\n# make sure\n$ make run tset\n```",
			want: []string{
				"docs/x.md:1: make deploy: no such target in the Makefile",
				"docs/x.md:5: make tset: no such target in the Makefile",
			},
		},
		{name: "a variable is not a target", give: "`make helm` is not `make $(BIN)/helm`, and `make LDFLAGS`", want: []string{
			"docs/x.md:1: make helm: no such target in the Makefile",
			"docs/x.md:1: make LDFLAGS: no such target in the Makefile",
		}},
		{name: "an unmatched backtick opens no span", give: "a ` alone\n\n`pkg/authn/keys.go`"},
		{name: "a fence of tildes", give: "~~~\n[a](missing.md)\n```\n~~~\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{"docs/x.md": {Data: []byte(tt.give)}}
			for name, f := range base {
				fsys[name] = f
			}
			_, problems, err := check(fsys)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range problems {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// problem is one broken reference: where it is written and what is wrong.
type problem struct {
	file string
	line int
	msg  string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.file, p.line, p.msg) }

// check reads every Markdown file of fsys, a repository's root, and
// returns the files it read and every broken reference in them.
func check(fsys fs.FS) (files []string, problems []problem, err error) {
	r, err := newRepo(fsys)
	if err != nil {
		return nil, nil, err
	}
	files, err = r.markdown()
	if err != nil {
		return nil, nil, err
	}
	for _, name := range files {
		ps, err := r.checkFile(name)
		if err != nil {
			return nil, nil, err
		}
		problems = append(problems, ps...)
	}
	return files, problems, nil
}

// repo is what the Markdown files of a tree may point at.
type repo struct {
	fsys fs.FS
	// generated are the directories the root's .gitignore names from the
	// root (/bin/, /test/closedloop/out/): build output, absent from a
	// fresh clone, so neither read nor checked.
	generated []string
	// top are the root's directories: a backticked path is taken for one
	// of the repository's when its first element is one of them.
	top     map[string]bool
	targets map[string]bool
	// parsed are the Markdown files read so far, by name.
	parsed map[string]*page
}

func newRepo(fsys fs.FS) (*repo, error) {
	r := &repo{fsys: fsys, top: map[string]bool{}, targets: map[string]bool{}, parsed: map[string]*page{}}
	if b, err := fs.ReadFile(fsys, ".gitignore"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if d, ok := strings.CutPrefix(strings.TrimSpace(l), "/"); ok && strings.HasSuffix(d, "/") && !strings.ContainsAny(d, "*?[") {
				r.generated = append(r.generated, strings.TrimSuffix(d, "/"))
			}
		}
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".git" && !r.isGenerated(e.Name()) {
			r.top[e.Name()] = true
		}
	}
	if b, err := fs.ReadFile(fsys, "Makefile"); err == nil {
		r.targets = makeTargets(string(b))
	}
	return r, nil
}

// isGenerated says whether name is in a directory of build output.
func (r *repo) isGenerated(name string) bool {
	for _, d := range r.generated {
		if name == d || strings.HasPrefix(name, d+"/") {
			return true
		}
	}
	return false
}

// markdown lists the Markdown files, sorted.
func (r *repo) markdown() ([]string, error) {
	var out []string
	err := fs.WalkDir(r.fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch {
			case name == ".":
			case d.Name() == ".git", d.Name() == "node_modules", d.Name() == "testdata", r.isGenerated(name):
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".md") {
			out = append(out, name)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// targetLine is a Makefile rule's first line: its targets, then a colon
// that is not :=. Variables ($(BIN)/helm) and special targets (.PHONY)
// are not names a reader types.
var targetLine = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9_-]*(?:[ \t]+[A-Za-z0-9][A-Za-z0-9_-]*)*)[ \t]*:(?:[^=]|$)`)

func makeTargets(makefile string) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(makefile, "\n") {
		if m := targetLine.FindStringSubmatch(l); m != nil {
			for _, t := range strings.Fields(m[1]) {
				out[t] = true
			}
		}
	}
	return out
}

func (r *repo) page(name string) (*page, error) {
	if p, ok := r.parsed[name]; ok {
		return p, nil
	}
	b, err := fs.ReadFile(r.fsys, name)
	if err != nil {
		return nil, err
	}
	p := parse(string(b))
	r.parsed[name] = p
	return p, nil
}

func (r *repo) checkFile(name string) ([]problem, error) {
	p, err := r.page(name)
	if err != nil {
		return nil, err
	}
	var out []problem
	add := func(line int, format string, args ...any) {
		out = append(out, problem{file: name, line: line, msg: fmt.Sprintf(format, args...)})
	}
	for _, l := range p.links {
		if msg := r.checkLink(name, l.text); msg != "" {
			add(l.line, "%s", msg)
		}
	}
	for _, s := range p.spans {
		if cmd, ok := strings.CutPrefix(s.text, "make "); ok {
			for _, t := range r.missingTargets(cmd) {
				add(s.line, "make %s: no such target in the Makefile", t)
			}
			continue
		}
		if msg := r.checkPath(name, s.text); msg != "" {
			add(s.line, "`%s`: %s", s.text, msg)
		}
	}
	for _, m := range p.makes {
		for _, t := range r.missingTargets(m.text) {
			add(m.line, "make %s: no such target in the Makefile", t)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].line < out[j].line })
	return out, nil
}

// scheme starts a link that leaves the repository (https:, mailto:).
var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)

// checkLink checks a link target written in the file name, and says what
// is wrong with it ("" when nothing).
func (r *repo) checkLink(name, target string) string {
	if scheme.MatchString(target) {
		return ""
	}
	file, anchor, _ := strings.Cut(target, "#")
	file, err := url.PathUnescape(file)
	if err != nil {
		return fmt.Sprintf("link to %s: %v", target, err)
	}
	anchor, err = url.PathUnescape(anchor)
	if err != nil {
		return fmt.Sprintf("link to %s: %v", target, err)
	}
	var rel string
	switch {
	case file == "":
		rel = name
	case strings.HasPrefix(file, "/"): // GitHub reads it from the repository's root
		rel = path.Clean(strings.TrimLeft(file, "/"))
	default:
		rel = path.Join(path.Dir(name), file)
	}
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Sprintf("link to %s leaves the repository", target)
	}
	show := rel
	if anchor != "" {
		show += "#" + anchor
	}
	if msg := r.exists(rel, anchor); msg != "" {
		return fmt.Sprintf("link to %s: %s", show, msg)
	}
	return ""
}

// exists says what is wrong with rel, a path from the root, and anchor, a
// heading ID in it ("" for none): "" when both are there.
func (r *repo) exists(rel, anchor string) string {
	info, err := fs.Stat(r.fsys, rel)
	if err != nil {
		return "no such file or directory"
	}
	if anchor == "" || info.IsDir() || !strings.HasSuffix(rel, ".md") {
		return ""
	}
	p, err := r.page(rel)
	if err != nil {
		return err.Error()
	}
	if !p.anchors[anchor] {
		return rel + " has no such heading"
	}
	return ""
}

var (
	// pathLike is a relative path with at least one slash, a glob's * and
	// ? allowed: no spaces, no scheme, no placeholders.
	pathLike = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.*?-]*(?:/[A-Za-z0-9_.*?-]+)*/?$`)
	// lineSuffix is a line or a range of lines after a file name.
	lineSuffix = regexp.MustCompile(`:[0-9]+(?:-[0-9]+)?$`)
)

// checkPath checks a code span of the file name that may be a path, and
// says what is wrong with it ("" when nothing, or when it is no path). A
// path is read from the root when its first element is a directory
// there, else from the file's directory when its first element is a
// directory there; other spans (application/json) are not paths.
func (r *repo) checkPath(name, span string) string {
	p := span
	if rest, ok := strings.CutPrefix(p, module+"/"); ok {
		p = rest
	}
	p = strings.TrimPrefix(p, "./")
	p = strings.TrimSuffix(p, "/...")
	p = lineSuffix.ReplaceAllString(p, "")
	file, anchor, _ := strings.Cut(p, "#")
	if !strings.Contains(file, "/") || !pathLike.MatchString(file) {
		return ""
	}
	first, _, _ := strings.Cut(file, "/")
	var rel string
	switch dir := path.Dir(name); {
	case r.top[first]:
		rel = path.Clean(file)
	case dir != "." && r.isDir(path.Join(dir, first)):
		rel = path.Join(dir, file)
	default:
		return ""
	}
	if r.isGenerated(rel) {
		return ""
	}
	if strings.ContainsAny(rel, "*?") {
		if m, err := fs.Glob(r.fsys, rel); err != nil || len(m) == 0 {
			return "no file matches"
		}
		return ""
	}
	return r.exists(rel, anchor)
}

func (r *repo) isDir(rel string) bool {
	info, err := fs.Stat(r.fsys, rel)
	return err == nil && info.IsDir()
}

// targetWord is a word of a make command line that names a target.
var targetWord = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// missingTargets returns the targets of a make command line (what follows
// "make ") that the Makefile lacks. Flags and VAR=value are skipped; the
// command ends at the first word that cannot be a target (&&, ;, #).
func (r *repo) missingTargets(args string) []string {
	var out []string
	for _, w := range words(args) {
		switch {
		case strings.HasPrefix(w, "-") || strings.Contains(w, "="):
		case !targetWord.MatchString(w):
			return out
		case !r.targets[w]:
			out = append(out, w)
		}
	}
	return out
}

// words splits a command line at spaces outside quotes, as a shell does:
// CONFIGS="a b" is one word.
func words(line string) []string {
	var out []string
	var w strings.Builder
	var quote rune
	in := false
	for _, c := range line {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == ' ' || c == '\t':
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
			continue
		}
		w.WriteRune(c)
		in = true
	}
	if in {
		out = append(out, w.String())
	}
	return out
}

// ref is something a page points at, and the line it is written on.
type ref struct {
	line int
	text string
}

// page is what the checks read of a Markdown file.
type page struct {
	// links are the targets of links, images and reference definitions
	// outside code.
	links []ref
	// spans are the inline code spans' contents, line breaks read as
	// spaces.
	spans []ref
	// makes are the lines of fenced code blocks that run make, from the
	// word after make.
	makes []ref
	// anchors are the IDs GitHub gives the headings.
	anchors map[string]bool
}

var (
	heading  = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	makeLine = regexp.MustCompile(`^\s*(?:\$\s+)?make\s+(.+)$`)
	// link is [text](target "title") or ![alt](target); the text may hold
	// one level of brackets.
	link   = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^\s()<>]*)>?(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	refDef = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s<>]+)>?`)
)

// parse reads a Markdown file as GitHub renders it, closely enough for
// the checks: fenced code blocks hold no links, headings or spans; code
// spans hold no links.
func parse(src string) *page {
	p := &page{anchors: map[string]bool{}}
	lines := strings.Split(src, "\n")
	prose := make([]string, len(lines))
	var fence string // the open fence's run of ` or ~, "" outside
	for i, l := range lines {
		t := strings.TrimLeft(l, " \t")
		if fence != "" {
			if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]+" \t") == "" {
				fence = ""
			} else if m := makeLine.FindStringSubmatch(l); m != nil {
				p.makes = append(p.makes, ref{line: i + 1, text: m[1]})
			}
			continue
		}
		if f := fenceRun(t); f != "" {
			fence = f
			continue
		}
		prose[i] = l
		if m := heading.FindStringSubmatch(l); m != nil {
			p.addAnchor(slug(m[2]))
		}
	}
	text := strings.Join(prose, "\n")
	var starts []int // the offset of each line after the first
	for i := 0; i < len(text); i++ {
		if text[i] == '\n' {
			starts = append(starts, i+1)
		}
	}
	lineOf := func(off int) int {
		n, _ := slices.BinarySearch(starts, off+1)
		return n + 1
	}
	text = p.codeSpans(text, lineOf)
	for _, m := range link.FindAllStringSubmatchIndex(text, -1) {
		// The line of the target, which is where a reader looks.
		p.links = append(p.links, ref{line: lineOf(m[2]), text: text[m[2]:m[3]]})
	}
	for _, m := range refDef.FindAllStringSubmatchIndex(text, -1) {
		p.links = append(p.links, ref{line: lineOf(m[2]), text: text[m[2]:m[3]]})
	}
	sort.SliceStable(p.links, func(i, j int) bool { return p.links[i].line < p.links[j].line })
	return p
}

// fenceRun returns the run of three or more ` or ~ that opens a fenced
// code block at the start of t, "" when t opens none.
func fenceRun(t string) string {
	for _, c := range []string{"`", "~"} {
		n := len(t) - len(strings.TrimLeft(t, c))
		if n >= 3 && (c == "~" || !strings.Contains(t[n:], "`")) {
			return t[:n]
		}
	}
	return ""
}

// codeSpans records the code spans of text and returns text with each
// span's bytes but its line breaks blanked, so that no link is found in
// one. A span cannot cross a blank line; a backtick run with no match
// before one is text.
func (p *page) codeSpans(text string, lineOf func(int) int) string {
	b := []byte(text)
	for i := 0; i < len(text); {
		switch text[i] {
		case '\\':
			i += 2
			continue
		case '`':
		default:
			i++
			continue
		}
		n := len(text[i:]) - len(strings.TrimLeft(text[i:], "`"))
		run := text[i : i+n]
		end := -1
		for j := i + n; j < len(text); {
			k := strings.Index(text[j:], run)
			if k < 0 {
				break
			}
			k += j
			m := len(text[k:]) - len(strings.TrimLeft(text[k:], "`"))
			if m == n {
				end = k
				break
			}
			j = k + m
		}
		if end < 0 || strings.Contains(text[i:end], "\n\n") {
			i += n
			continue
		}
		content := strings.ReplaceAll(text[i+n:end], "\n", " ")
		if len(content) > 1 && content[0] == ' ' && content[len(content)-1] == ' ' && strings.Trim(content, " ") != "" {
			content = content[1 : len(content)-1]
		}
		p.spans = append(p.spans, ref{line: lineOf(i), text: content})
		for k := i; k < end+n; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end + n
	}
	return string(b)
}

// addAnchor records a heading's ID as GitHub makes it unique: the second
// "a" is a-1, the third a-2.
func (p *page) addAnchor(s string) {
	id := s
	for n := 1; p.anchors[id]; n++ {
		id = fmt.Sprintf("%s-%d", s, n)
	}
	p.anchors[id] = true
}

var (
	inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// slug is the ID GitHub gives a heading: its text as rendered (no code
// backticks, a link's text only, no tags), in lower case, each space a
// hyphen, and every character but letters, digits, hyphens and
// underscores dropped.
func slug(h string) string {
	h = inlineLink.ReplaceAllString(h, "$1")
	h = htmlTag.ReplaceAllString(h, "")
	h = strings.ReplaceAll(h, "`", "")
	var b strings.Builder
	for _, c := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case c == ' ':
			b.WriteByte('-')
		case c == '-' || c == '_' || unicode.IsLetter(c) || unicode.IsDigit(c) || unicode.IsMark(c):
			b.WriteRune(c)
		}
	}
	return b.String()
}
