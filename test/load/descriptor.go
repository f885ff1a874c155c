package load

import (
	"errors"
	"fmt"
	"strings"
)

// Entry is one descriptor entry.
type Entry struct {
	Key   string
	Value string
}

// Descriptor is one rate limit descriptor: its entries in order.
type Descriptor []Entry

// ParseDescriptor parses the -descriptor syntax: entries separated by
// ',', each entry key=value. The first unescaped '=' of an entry ends its
// key; later '=' belong to the value. A backslash escapes the next
// character, which must be ',', '=' or '\': write `\,` for a comma in a
// key or value, `\=` for an equals sign in a key, `\\` for a backslash.
// Keys must be non-empty; values may be empty ("key=").
//
//	tenant=acme,model=gpt-4o           two entries
//	path=/a\,b,q=x=y                   path is "/a,b", q is "x=y"
func ParseDescriptor(s string) (Descriptor, error) {
	if s == "" {
		return nil, errors.New("empty descriptor")
	}
	var (
		d      Descriptor
		cur    strings.Builder
		key    string
		inVal  bool
		escape bool
	)
	end := func() error {
		if !inVal {
			if cur.Len() == 0 {
				return fmt.Errorf("entry %d is empty", len(d)+1)
			}
			return fmt.Errorf("entry %d (%q) has no '='", len(d)+1, cur.String())
		}
		if key == "" {
			return fmt.Errorf("entry %d has an empty key", len(d)+1)
		}
		d = append(d, Entry{Key: key, Value: cur.String()})
		cur.Reset()
		key, inVal = "", false
		return nil
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escape:
			if c != ',' && c != '=' && c != '\\' {
				return nil, fmt.Errorf("offset %d: '\\%c' is not an escape (use \\, \\= or \\\\)", i-1, c)
			}
			cur.WriteByte(c)
			escape = false
		case c == '\\':
			escape = true
		case c == ',':
			if err := end(); err != nil {
				return nil, err
			}
		case c == '=' && !inVal:
			key, inVal = cur.String(), true
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	if escape {
		return nil, errors.New("trailing '\\'")
	}
	if err := end(); err != nil {
		return nil, err
	}
	return d, nil
}

// String formats d in the syntax ParseDescriptor reads, escaping as
// needed, so ParseDescriptor(d.String()) equals d.
func (d Descriptor) String() string {
	var b strings.Builder
	for i, e := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		writeEscaped(&b, e.Key, true)
		b.WriteByte('=')
		writeEscaped(&b, e.Value, false)
	}
	return b.String()
}

func writeEscaped(b *strings.Builder, s string, key bool) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == ',' || c == '\\' || (key && c == '=') {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
}

// descriptorsFlag collects repeated -descriptor flags.
type descriptorsFlag struct{ ds *[]Descriptor }

func (f descriptorsFlag) String() string {
	if f.ds == nil {
		return ""
	}
	parts := make([]string, len(*f.ds))
	for i, d := range *f.ds {
		parts[i] = d.String()
	}
	return strings.Join(parts, " ")
}

func (f descriptorsFlag) Set(s string) error {
	d, err := ParseDescriptor(s)
	if err != nil {
		return err
	}
	*f.ds = append(*f.ds, d)
	return nil
}
