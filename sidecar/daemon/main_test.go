package daemon

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its tests: the daemon
// owns the most goroutines of gpumem (discovery, attach and inject per
// kernel, the tick, reclaim's pidfd waits, the API), and each must return
// when its Run's context ends. goleak, as the other unit packages use, and
// not testenv's marker check: this package starts no real servers, so every
// goroutine left is one of ours, whatever its stack says.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
