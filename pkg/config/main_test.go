package config

import (
	"testing"

	"go.uber.org/goleak"
)

// The watchers start goroutines (and fsnotify's): none may outlive the
// test that started it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
