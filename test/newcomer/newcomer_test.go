package newcomer

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/test/redistest"
	"github.com/tollgate-dev/tollgate/test/tollgatetest"
)

const root = "../.."

// TestREADME runs the README's examples against `make run`, command by
// command, and checks each output the README states.
func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs tollgate with make run")
	}
	grpcurl, err := filepath.Abs(filepath.Join(root, "bin", "grpcurl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(grpcurl); err != nil {
		t.Fatalf("%s: %v: run make grpcurl (make test does)", grpcurl, err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	steps := newcomerPath(t, string(readme))

	grpcAddr, adminAddr := tollgatetest.FreeAddr(t), tollgatetest.FreeAddr(t)
	startMakeRun(t, grpcAddr, adminAddr)
	tmp := t.TempDir()
	sh := &shell{t: t, dir: root, env: append(os.Environ(), "PATH="+filepath.Dir(grpcurl)+":"+os.Getenv("PATH")),
		replace: strings.NewReplacer("localhost:8081", grpcAddr, "localhost:8080", adminAddr, "/tmp/", tmp+"/")}

	for _, st := range steps {
		t.Logf("README: %s", st.name)
		var last string
		for _, c := range st.commands {
			last = sh.run(c.text)
			for _, claim := range c.comments {
				checkClaim(t, st.name, c.text, claim, last)
			}
		}
		if st.check != nil {
			st.check(t, sh, last)
		}
	}
}

// step is one example of the README: its commands, and what else it
// states about their output.
type step struct {
	name     string
	commands []command
	check    func(t *testing.T, sh *shell, lastOutput string)
}

// newcomerPath finds the README's examples, in the order a newcomer
// meets them. Each is found by the words that introduce it, so that a
// README that drops one fails here rather than goes untested.
func newcomerPath(t *testing.T, readme string) []step {
	t.Helper()
	first := section(t, readme, "## A first call")
	shed := after(t, readme, "**Try it.** `make run` serves the admin push endpoint")
	authz := section(t, readme, "### Try it")

	firstBlocks := fences(first)
	authzBlocks := fences(authz)
	shedBlocks := fences(shed)
	if len(firstBlocks) < 2 || firstBlocks[0].lang != "sh" || firstBlocks[1].lang != "json" {
		t.Fatalf("README's first call: want a sh block then its json output, got %+v", firstBlocks)
	}
	if len(shedBlocks) < 1 || shedBlocks[0].lang != "sh" {
		t.Fatal("README's shedding example: no sh block after its Try it")
	}
	if len(authzBlocks) < 2 || authzBlocks[0].lang != "sh" || authzBlocks[1].lang != "json" {
		t.Fatalf("README's ext_authz Try it: want a sh block, then the denial as json, got %+v", authzBlocks)
	}
	// The prose between the ext_authz block and its denial says what the
	// first two calls set.
	prose := authz[strings.Index(authz, authzBlocks[0].end):strings.Index(authz, authzBlocks[1].start)]
	if !strings.Contains(prose, "The first two calls are allowed") {
		t.Fatalf("README's ext_authz Try it no longer says the first two calls are allowed:\n%s", prose)
	}
	authzCmds := commands(t, authzBlocks[0].body)
	return []step{
		{
			name:     "a first call",
			commands: commands(t, firstBlocks[0].body),
			check: func(t *testing.T, _ *shell, out string) {
				checkSubset(t, "the first call's output", firstBlocks[1].body, out)
			},
		},
		{name: "shedding by pushed pressure", commands: commands(t, shedBlocks[0].body)},
		{
			name:     "an API key's token budget",
			commands: authzCmds,
			check: func(t *testing.T, sh *shell, first string) {
				check := authzCmds[len(authzCmds)-1].text
				second, third := sh.run(check), sh.run(check)
				for i, out := range []string{first, second} {
					if !strings.Contains(out, `"okResponse"`) {
						t.Errorf("ext_authz call %d: want okResponse, got\n%s", i+1, out)
					}
					for _, h := range headerClaims(prose) {
						checkHeader(t, fmt.Sprintf("ext_authz call %d", i+1), h, out)
					}
				}
				if !strings.Contains(third, `"deniedResponse"`) {
					t.Fatalf("ext_authz call 3: want deniedResponse, got\n%s", third)
				}
				checkClaim(t, "the third ext_authz call", check, authzBlocks[1].body, third)
			},
		},
	}
}

// section is the README from heading to the next heading of its level
// or above.
func section(t *testing.T, s, heading string) string {
	t.Helper()
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", heading)
	}
	level := strings.Count(strings.Fields(heading)[0], "#")
	rest := s[i+1+len(heading):]
	for _, line := range strings.SplitAfter(rest, "\n") {
		if n := len(line) - len(strings.TrimLeft(line, "#")); n > 0 && n <= level && strings.HasPrefix(line[n:], " ") {
			return s[i : i+1+len(heading)+strings.Index(rest, line)]
		}
	}
	return s[i:]
}

// after is the README from the paragraph starting with text to the next
// heading.
func after(t *testing.T, s, text string) string {
	t.Helper()
	i := strings.Index(s, text)
	if i < 0 {
		t.Fatalf("README has no %q", text)
	}
	rest := s[i:]
	// The next heading: README's are ## and ###; a # line is a comment
	// in a sh block.
	if j := headingRE.FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}

type fence struct {
	lang, body string
	start, end string // the opening line and the closing fence, to find the text between
}

var (
	fenceRE   = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```\n?")
	heredocRE = regexp.MustCompile(`<<'?([A-Z]+)'?`)
	headingRE = regexp.MustCompile(`\n##+ `)
)

func fences(s string) []fence {
	var out []fence
	for _, m := range fenceRE.FindAllStringSubmatch(s, -1) {
		out = append(out, fence{lang: m[1], body: m[2], start: "```" + m[1] + "\n" + m[2], end: m[2] + "```"})
	}
	return out
}

// command is one shell command of a block, with the comment lines after
// it: what the README says it prints.
type command struct {
	text     string
	comments []string
}

// commands splits a sh block into commands: a line continues while it
// ends in a backslash, while a single quote is open, and through a here
// document; a comment line belongs to the command before it.
func commands(t *testing.T, block string) []command {
	t.Helper()
	var out []command
	var cur strings.Builder
	heredoc := ""
	quotes := 0
	for _, line := range strings.Split(strings.TrimRight(block, "\n"), "\n") {
		switch {
		case heredoc != "":
			cur.WriteString(line + "\n")
			if strings.TrimSpace(line) == heredoc {
				heredoc = ""
				out = append(out, command{text: cur.String()})
				cur.Reset()
			}
			continue
		case cur.Len() == 0 && strings.HasPrefix(strings.TrimSpace(line), "#"):
			if len(out) == 0 {
				t.Fatalf("a comment before any command: %q", line)
			}
			out[len(out)-1].comments = append(out[len(out)-1].comments, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#")))
			continue
		case cur.Len() == 0 && strings.TrimSpace(line) == "":
			continue
		}
		cur.WriteString(line + "\n")
		if m := heredocRE.FindStringSubmatch(line); m != nil && quotes%2 == 0 {
			heredoc = m[1]
			continue
		}
		quotes += strings.Count(line, "'")
		if quotes%2 == 1 || strings.HasSuffix(line, `\`) {
			continue
		}
		out = append(out, command{text: cur.String()})
		cur.Reset()
		quotes = 0
	}
	if cur.Len() > 0 {
		t.Fatalf("an unfinished command: %q", cur.String())
	}
	return out
}

// shell runs commands as the README's reader would, from the repository.
type shell struct {
	t       *testing.T
	dir     string
	env     []string
	replace *strings.Replacer
}

func (s *shell) run(text string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-eo", "pipefail", "-c", s.replace.Replace(text))
	cmd.Dir, cmd.Env = s.dir, s.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("README command failed: %v\n%s\nstdout:\n%s\nstderr:\n%s", err, text, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// startMakeRun runs `make run` with ARGS moving its ports, as the README's
// first command, and waits until it is ready.
func startMakeRun(t *testing.T, grpcAddr, adminAddr string) {
	t.Helper()
	log := &redistest.TailBuffer{Max: 32 << 10}
	cmd := exec.Command("make", "-s", "run", "ARGS=--grpc-addr "+grpcAddr+" --admin-addr "+adminAddr)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		// make exits non-zero when its serve is stopped: the error says
		// nothing here.
		select {
		case err := <-done:
			_ = err
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			err := <-done
			_ = err
		}
	})
	deadline := time.Now().Add(3 * time.Minute) // make run builds first
	for {
		select {
		case err := <-done:
			t.Fatalf("make run exited: %v\n%s", err, log)
		default:
		}
		resp, err := http.Get("http://" + adminAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("make run not ready after 3 minutes:\n%s", log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Values that change from run to run: the README shows one run's.
var (
	volatileKeys    = map[string]bool{"durationUntilReset": true, "message": true, "reserved_at_ms": true}
	volatileHeaders = map[string]bool{"x-ratelimit-reset": true, "x-ratelimit-reset-requests": true, "x-ratelimit-reset-tokens": true}
	pairRE          = regexp.MustCompile(`"([A-Za-z_]+)":\s*("(?:[^"\\]|\\.)*"|-?[0-9][0-9.]*|true|false)`)
	headerRE        = regexp.MustCompile(`\b(x-[a-z0-9-]+|retry-after|content-type): ([^\s,;"` + "`" + `]+)`)
)

// checkClaim checks what stated says about out: each "key": value pair
// is in out's JSON (or in a body it carries), each header: value is a
// header out sets, and a line that starts with a metric name is a line
// of out. Values that vary from run to run are not compared.
func checkClaim(t *testing.T, where, cmd, stated, out string) {
	t.Helper()
	stated = strings.ReplaceAll(stated, `\"`, `"`)
	if strings.HasPrefix(stated, "tollgate_") {
		if !strings.Contains("\n"+out, "\n"+stated+"\n") {
			t.Errorf("%s: the README says %q is printed by\n%s\ngot\n%s", where, stated, cmd, out)
		}
		return
	}
	hay := haystack(out)
	for _, m := range pairRE.FindAllStringSubmatch(stated, -1) {
		if volatileKeys[m[1]] || m[1] == "body" {
			continue // a body's own pairs are checked one by one
		}
		want := `"` + m[1] + `":` + m[2]
		if !strings.Contains(hay, want) {
			t.Errorf("%s: the README says %s, got\n%s", where, want, out)
		}
	}
	for _, h := range headerClaims(stated) {
		checkHeader(t, where, h, out)
	}
}

type header struct{ name, value string }

func headerClaims(s string) []header {
	var out []header
	for _, m := range headerRE.FindAllStringSubmatch(s, -1) {
		out = append(out, header{m[1], m[2]})
	}
	return out
}

// checkHeader checks that out sets header h, its value starting with h's
// (the README abbreviates long ones). A retry-after of more than a
// minute is a time left, which varies.
func checkHeader(t *testing.T, where string, h header, out string) {
	t.Helper()
	got, ok := headers(out)[h.name]
	if !ok {
		t.Errorf("%s: the README says %s: %s is set, got\n%s", where, h.name, h.value, out)
		return
	}
	if n, err := strconv.Atoi(h.value); volatileHeaders[h.name] || (h.name == "retry-after" && err == nil && n > 60) {
		return
	}
	if !strings.HasPrefix(got, h.value) {
		t.Errorf("%s: the README says %s: %s, got %s: %s", where, h.name, h.value, h.name, got)
	}
}

// haystack is out's JSON compacted, with the bodies it carries decoded
// and compacted too.
func haystack(out string) string {
	parts := []string{compact(out)}
	var v any
	if json.Unmarshal([]byte(out), &v) == nil {
		walk(v, func(k string, x any) {
			s, ok := x.(string)
			switch {
			case !ok:
			case k == "rawBody":
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					parts = append(parts, compact(string(b)))
				}
			case k == "body":
				parts = append(parts, compact(s))
			}
		})
	}
	return strings.Join(parts, "\n")
}

func compact(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return s
	}
	return b.String()
}

// headers are the header key/value pairs out's JSON holds, wherever:
// responseHeadersToAdd, and ext_authz's {"header": {key, value}}.
func headers(out string) map[string]string {
	h := map[string]string{}
	var v any
	if json.Unmarshal([]byte(out), &v) != nil {
		return h
	}
	var visit func(x any)
	visit = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			k, kok := x["key"].(string)
			val, vok := x["value"].(string)
			if kok && vok {
				h[k] = val
			}
			for _, c := range x {
				visit(c)
			}
		case []any:
			for _, c := range x {
				visit(c)
			}
		}
	}
	visit(v)
	return h
}

func walk(v any, f func(k string, x any)) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			f(k, x)
			walk(x, f)
		}
	case []any:
		for _, x := range v {
			walk(x, f)
		}
	}
}

// checkSubset checks that the JSON out holds everything the JSON the
// README shows holds: every key of an object, an element of every list
// entry (in any order), equal values but for those that vary.
func checkSubset(t *testing.T, where, want, out string) {
	t.Helper()
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: the README's JSON does not parse: %v\n%s", where, err, want)
	}
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatalf("%s: the output is not JSON: %v\n%s", where, err, out)
	}
	if path, ok := subset(w, g, "$"); !ok {
		t.Errorf("%s: the README shows what the output lacks, at %s\nREADME:\n%s\ngot:\n%s", where, path, want, out)
	}
}

func subset(w, g any, path string) (string, bool) {
	switch w := w.(type) {
	case map[string]any:
		gm, ok := g.(map[string]any)
		if !ok {
			return path, false
		}
		if k, _ := w["key"].(string); volatileHeaders[k] {
			return path, gm["key"] == k
		}
		for k, wv := range w {
			gv, has := gm[k]
			if !has {
				return path + "." + k, false
			}
			if volatileKeys[k] {
				continue
			}
			if p, ok := subset(wv, gv, path+"."+k); !ok {
				return p, false
			}
		}
		return "", true
	case []any:
		gl, ok := g.([]any)
		if !ok {
			return path, false
		}
		for i, wv := range w {
			found := false
			for _, gv := range gl {
				if _, ok := subset(wv, gv, path); ok {
					found = true
					break
				}
			}
			if !found {
				return fmt.Sprintf("%s[%d]", path, i), false
			}
		}
		return "", true
	}
	return path, w == g
}
