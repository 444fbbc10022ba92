// Package syncutil holds the small synchronisation helpers gpumem's servers
// share.
package syncutil

import (
	"sync"
	"time"
)

// WaitTimeout waits for wg up to d and reports whether it finished. On a
// timeout the helper goroutine lives on until wg finishes: use it only for
// groups that do finish (servers' connection goroutines after Shutdown).
func WaitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
