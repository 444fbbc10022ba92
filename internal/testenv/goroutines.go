package testenv

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// Goroutines returns the stacks of the running goroutines (other than the
// caller's) whose stack mentions any of substrs.
func Goroutines(substrs ...string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 {
			continue // the caller's own goroutine comes first
		}
		for _, s := range substrs {
			if strings.Contains(g, s) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// WaitNoGoroutines polls until no goroutine's stack mentions any of substrs,
// and fails the test with their stacks if some remain after timeout.
func WaitNoGoroutines(t testing.TB, timeout time.Duration, substrs ...string) {
	t.Helper()
	if left := WaitGoroutinesGone(timeout, substrs...); len(left) > 0 {
		t.Fatalf("%d goroutines left after %v:\n\n%s", len(left), timeout, strings.Join(left, "\n\n"))
	}
}

// WaitGoroutinesGone polls until no goroutine's stack mentions any of
// substrs, and returns the stacks of those left after timeout (for
// TestMain, which has no testing.TB).
func WaitGoroutinesGone(timeout time.Duration, substrs ...string) []string {
	deadline := time.Now().Add(timeout)
	for {
		left := Goroutines(substrs...)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}
