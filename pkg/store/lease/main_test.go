package lease_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Run starts no goroutine of its own, but the tests run it in one: none
// may outlive its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
