package app

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// redisLogs sends go-redis's log lines (sentinel failovers, cluster
// nodes that fail) to serve's zap logger, instead of plain text into the
// JSON log on stderr. go-redis keeps one logger for the whole process
// (redis.SetLogger), hence this package variable, the one exception to
// passing loggers in: it holds the loggers of the serves running, one in
// production, several when tests run serve in-process in parallel.
var redisLogs = &redisLog{}

// redisLog is a go-redis logger: it writes each line to every logger
// added to it. install sets redisLogs as go-redis's, once.
type redisLog struct {
	install sync.Once
	mu      sync.RWMutex
	logs    map[*zap.Logger]struct{}
}

// routeRedisLog sends go-redis's lines to log until stop is called.
func routeRedisLog(log *zap.Logger) (stop func()) {
	redisLogs.install.Do(func() { redis.SetLogger(redisLogs) })
	return redisLogs.add(log.Named("go-redis"))
}

// add writes r's lines to log too until remove is called.
func (r *redisLog) add(log *zap.Logger) (remove func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logs == nil {
		r.logs = map[*zap.Logger]struct{}{}
	}
	r.logs[log] = struct{}{}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.logs, log)
	}
}

// Printf logs one go-redis line. go-redis gives no level: a line that
// reports a failure is a warning, any other (a sentinel's new master, an
// address chosen) is information.
func (r *redisLog) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	lvl := zapcore.InfoLevel
	if lower := strings.ToLower(msg); strings.Contains(lower, "fail") || strings.Contains(lower, "error") {
		lvl = zapcore.WarnLevel
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for log := range r.logs {
		log.Log(lvl, msg)
	}
}
