//go:build !race

package lifecycle

// raceEnabled: the race detector slows the test's own code several times.
const raceEnabled = false
