package app

import (
	"fmt"
	"io"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger builds the process logger writing to w. Sampling caps a
// repeated message at 100 a second after the first 100, so a store
// outage cannot turn every failed decision into a log line.
func newLogger(w io.Writer, level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		cfg := zap.NewProductionEncoderConfig()
		cfg.TimeKey = "ts"
		cfg.EncodeTime = zapcore.RFC3339NanoTimeEncoder
		enc = zapcore.NewJSONEncoder(cfg)
	case "console":
		enc = zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	default:
		return nil, fmt.Errorf("--log-format %q: want json or console", format)
	}
	out := zapcore.Lock(zapcore.AddSync(w))
	core := zapcore.NewSamplerWithOptions(zapcore.NewCore(enc, out, lvl), time.Second, 100, 100)
	return zap.New(core, zap.ErrorOutput(out)), nil
}

// logProblems logs each line of err (a config.Errors renders one problem
// per line) as its own entry, so each stays greppable.
func logProblems(log *zap.Logger, msg string, err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		if line != "" {
			log.Error(msg, zap.String("problem", line))
		}
	}
}
