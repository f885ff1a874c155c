package config

import (
	"strconv"
	"strings"
)

// Problem is one error in a rule file. An operator fixing a file needs
// to know where to look, so every problem carries the file, the line and
// the path of the YAML node it is about.
type Problem struct {
	// File is the file's path as given to Load, or the name given to Parse.
	File string
	// Line is 1-based; 0 when the problem is about the whole file (it is
	// too large, or the YAML parser gave no line).
	Line int
	// Path names the node with YAML keys and list indices, as in
	// descriptors[1].descriptors[0].token_limit.tokens_per_unit. It is
	// empty for problems about the file itself.
	Path string
	// Msg says what is wrong.
	Msg string
}

// String renders the problem as "file:line: path: message", leaving out
// the line when it is 0 and the path when it is empty.
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(p.Line))
	}
	b.WriteString(": ")
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Errors is every problem found; it is the error Load and Parse return
// for bad rules, so a caller can list them one by one (errors.As) or
// print them all at once.
type Errors []Problem

// Error renders one Problem per line.
func (e Errors) Error() string {
	var b strings.Builder
	for i, p := range e {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.String())
	}
	return b.String()
}
