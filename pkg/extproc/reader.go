package extproc

import "strings"

// bodyKind is how a response body is read.
type bodyKind uint8

const (
	kindSniff bodyKind = iota // decided by the first byte that is not whitespace
	kindJSON                  // one JSON document
	kindSSE                   // text/event-stream
)

// kindOf picks the reading from a Content-Type. Anything that is neither
// JSON nor an event stream (a missing type, text/plain from a sloppy
// server) is sniffed.
func kindOf(contentType string) bodyKind {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	switch {
	case mt == "text/event-stream":
		return kindSSE
	case mt == "application/json", strings.HasSuffix(mt, "+json"):
		return kindJSON
	}
	return kindSniff
}

// SSE line states.
const (
	lineStart uint8 = iota // at the start of a line
	lineField              // in a field name
	lineSpace              // just after "data:": one space is skipped
	lineData               // in a data value
	lineSkip               // in a line that is not data: skipped to its end
)

// done is the data of the event that ends an OpenAI stream.
const done = "[DONE]"

// usageReader reads a response body a chunk at a time, split anywhere,
// and keeps only a fixed-size state: never the body.
//
// For text/event-stream it follows the SSE framing (lines end in \r\n,
// \n or \r; an event ends at a blank line; data lines are joined with
// \n) and scans each event's data as one JSON document. The usage is
// that of the last event with a valid usage object before data: [DONE];
// events after [DONE] are not read. Each event's streamed text is added
// to the character count once the event is complete and valid.
type usageReader struct {
	kind bodyKind
	js   jsonScanner

	// SSE state.
	line      uint8
	cr        bool // the last byte was a \r, so a \n right after it ends nothing
	field     int  // bytes of the field name read
	isData    bool // the field name read so far is "data"
	hasData   bool // the event has a data line
	dataLen   int  // bytes of the event's data (with the \n between lines)
	dataHead  [len(done)]byte
	streamEnd bool // data: [DONE] was seen

	// Results.
	usage    usageAcc
	reported bool
	chars    uint64
}

func newUsageReader(kind bodyKind) *usageReader {
	r := &usageReader{kind: kind}
	r.js.reset()
	return r
}

// write reads the next bytes of the body.
func (r *usageReader) write(p []byte) {
	if r.kind == kindSniff {
		i := 0
		for i < len(p) && isSpace(p[i]) {
			i++
		}
		if i == len(p) {
			return // whitespace says nothing, and neither reading minds it
		}
		r.kind = kindSSE
		if p[i] == '{' {
			r.kind = kindJSON
		}
	}
	if r.kind == kindJSON {
		r.js.feed(p)
		return
	}
	r.sse(p)
}

// finish ends the body, complete or cut.
func (r *usageReader) finish() {
	switch r.kind {
	case kindJSON:
		r.event()
	case kindSSE:
		// Tolerate a last event whose blank line never came: a stream cut
		// right after a complete data line still counts it.
		if r.hasData && !r.streamEnd {
			r.event()
		}
	}
}

// event takes the finished document in r.js.
func (r *usageReader) event() {
	if !r.js.complete() {
		return
	}
	if u, ok := r.js.usage(); ok {
		r.usage, r.reported = u, true
	}
	r.chars = addSat(r.chars, r.js.chars())
}

func (r *usageReader) sse(p []byte) {
	for i := 0; i < len(p); i++ {
		if r.streamEnd {
			return
		}
		c := p[i]
		if c == '\r' || c == '\n' {
			if c == '\n' && r.cr {
				r.cr = false
				continue // the \n of a \r\n
			}
			r.cr = c == '\r'
			r.endLine()
			continue
		}
		r.cr = false
		switch r.line {
		case lineStart:
			if c == ':' { // a comment
				r.line = lineSkip
				continue
			}
			r.line, r.field, r.isData = lineField, 0, true
			fallthrough
		case lineField:
			if c == ':' {
				if r.isData && r.field == 4 {
					r.startData()
					r.line = lineSpace
				} else {
					r.line = lineSkip
				}
				continue
			}
			r.isData = r.isData && r.field < 4 && c == "data"[r.field]
			r.field++
		case lineSpace:
			r.line = lineData
			if c == ' ' {
				continue
			}
			fallthrough
		case lineData:
			j := i
			for j < len(p) && p[j] != '\r' && p[j] != '\n' {
				j++
			}
			r.data(p[i:j])
			i = j - 1
		case lineSkip:
			j := i
			for j < len(p) && p[j] != '\r' && p[j] != '\n' {
				j++
			}
			i = j - 1
		}
	}
}

// startData begins a data line of the current event.
func (r *usageReader) startData() {
	if r.hasData {
		r.data([]byte{'\n'}) // lines of one event's data are joined with \n
	}
	r.hasData = true
}

// data takes bytes of the event's data.
func (r *usageReader) data(b []byte) {
	if r.dataLen < len(done) {
		copy(r.dataHead[r.dataLen:], b)
	}
	r.dataLen += len(b)
	r.js.feed(b)
}

// endLine ends a line; a blank line ends the event.
func (r *usageReader) endLine() {
	switch r.line {
	case lineStart:
		r.dispatch()
	case lineField:
		if r.isData && r.field == 4 { // "data" alone: an empty data line
			r.startData()
		}
	}
	r.line = lineStart
}

// dispatch ends an event.
func (r *usageReader) dispatch() {
	if !r.hasData {
		return
	}
	if r.dataLen == len(done) && string(r.dataHead[:]) == done {
		r.streamEnd = true
	} else {
		r.event()
	}
	r.hasData, r.dataLen = false, 0
	r.js.reset()
}

// result returns what the body said.
func (r *usageReader) result() Usage {
	u := Usage{Reported: r.reported, StreamedChars: r.chars}
	if r.reported {
		u.Input, u.Output, u.Total = r.usage.counts()
	}
	return u
}
