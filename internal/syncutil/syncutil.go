// Package syncutil holds the small synchronisation helpers gpumem's servers
// share.
package syncutil

import (
	"bytes"
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

// Buffer is a bytes.Buffer safe for concurrent writes and reads: where
// tests collect a logger's output written from other goroutines.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
