//go:build tools

// Package deps pins the modules the project builds on until code imports them.
package deps

import (
	_ "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "go.uber.org/goleak"
	_ "go.uber.org/zap"
	_ "google.golang.org/grpc"
	_ "gopkg.in/yaml.v3"
)
