package discovery

import (
	"sync"
	"time"
)

// A server that does not answer /api/sessions in time (it trickles an
// enormous body, or never answers) is one of its user's making, and every
// scan waiting on it delays the discovery of everyone's kernels. Each is
// asked with a deadline (Options.ServerTimeout), and one that failed is
// asked again only after a delay that doubles with each failure in a row.

// Server backoff bounds: the first delay after a failure, and the most.
const (
	serverBackoffFirst = time.Second
	serverBackoffMax   = 2 * time.Minute
)

// ServerBackoff remembers, from one Discover to the next, which servers
// failed and when each may be asked again. It is safe for concurrent use;
// the zero value is ready.
type ServerBackoff struct {
	mu    sync.Mutex
	tries map[string]serverTry // by server file
	now   func() time.Time     // nil: time.Now (tests set it)
}

type serverTry struct {
	failures int
	next     time.Time // not asked before
}

func (b *ServerBackoff) clock() time.Time {
	if b.now != nil {
		return b.now()
	}
	return time.Now()
}

// allow reports whether the server of file may be asked now.
func (b *ServerBackoff) allow(file string) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tries[file]
	return !ok || !b.clock().Before(t.next)
}

// done records how asking the server of file went: a success forgets its
// failures, a failure pushes its next try back.
func (b *ServerBackoff) done(file string, failed bool) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !failed {
		delete(b.tries, file)
		return
	}
	if b.tries == nil {
		b.tries = map[string]serverTry{}
	}
	t := b.tries[file]
	t.failures++
	delay := serverBackoffMax
	if t.failures < 8 { // 1 s << 7 is past the cap already
		delay = min(serverBackoffFirst<<(t.failures-1), serverBackoffMax)
	}
	t.next = b.clock().Add(delay)
	b.tries[file] = t
}

// keep forgets the servers whose files are gone.
func (b *ServerBackoff) keep(files map[string]bool) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for f := range b.tries {
		if !files[f] {
			delete(b.tries, f)
		}
	}
}
