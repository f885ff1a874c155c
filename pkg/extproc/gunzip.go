package extproc

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
)

// errTooLarge stops a gzip body that decodes to more than the bound.
var errTooLarge = errors.New("gzip body decodes to more than the bound")

// gunzipBuf is the size of the decoded chunks handed to the reader.
const gunzipBuf = 4 << 10

// gunzipper decodes a gzip body that arrives in chunks. compress/gzip
// reads from an io.Reader and cannot resume after running out of input,
// so it runs on its own goroutine behind a pipe: write hands it the next
// compressed chunk and returns once the chunk is consumed. Until close
// returns, only that goroutine touches the usageReader.
type gunzipper struct {
	pw   *io.PipeWriter
	done chan struct{}

	// Written by the goroutine, read after done is closed.
	err     error
	decoded int64
}

// startGunzip decodes into dst, at most limit decoded bytes.
func startGunzip(dst *usageReader, limit int64) *gunzipper {
	pr, pw := io.Pipe()
	g := &gunzipper{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(g.done)
		g.err = g.run(pr, dst, limit)
		// Any later write fails at once instead of blocking: the stream
		// goroutine then just stops feeding.
		_ = pr.CloseWithError(errStopped) // always nil for a PipeReader
	}()
	return g
}

// errStopped is what a write sees after the decoder stopped.
var errStopped = errors.New("gzip decoder stopped")

func (g *gunzipper) run(pr io.Reader, dst *usageReader, limit int64) error {
	zr, err := gzip.NewReader(pr)
	if err != nil {
		return fmt.Errorf("read gzip header: %w", err)
	}
	var buf [gunzipBuf]byte
	for {
		n, err := zr.Read(buf[:])
		if n > 0 {
			// What fits in the bound is still read: a stream's text up
			// to there counts.
			fit := int(min(int64(n), limit-g.decoded))
			g.decoded += int64(fit)
			dst.write(buf[:fit])
			if fit < n {
				return errTooLarge
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("decode gzip: %w", err)
		}
	}
}

// write hands the decoder the next compressed bytes; false once it has
// stopped (the body is done, corrupt or too large).
func (g *gunzipper) write(p []byte) bool {
	_, err := g.pw.Write(p)
	return err == nil
}

// close ends the input and waits for the decoder to finish; it returns
// why decoding stopped early, if it did. A body cut short shows as an
// unexpected EOF.
func (g *gunzipper) close() error {
	_ = g.pw.Close()
	<-g.done
	return g.err
}
