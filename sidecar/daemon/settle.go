package daemon

import (
	"context"
	"sync"
	"time"
)

// Settle returns once a sample that began after the call has retired every
// kernel process that had exited by then (starting the reclaim of its
// tree), and every reclaim started so far has finished; or when ctx ends,
// with its error. Run must be running. A daemon whose Jupyter server is
// gone calls it before it stops: the orphans of the kernels that server
// shut down on its way out are still ended.
func (d *Daemon) Settle(ctx context.Context) error {
	d.mu.Lock()
	start := d.pub.seq
	d.mu.Unlock()
	// A sample under way when Settle was called may have read /proc before
	// a kernel exited: wait for the one after it.
	for {
		ch := d.hist.sampledChan()
		d.mu.Lock()
		seq := d.pub.seq
		d.mu.Unlock()
		if seq >= start+2 {
			break
		}
		d.sampleSoon()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return d.reclaims.wait(ctx)
}

// ReclaimTakes bounds how long a reclaim takes once its kernel is
// retired, a sample or two aside: the grace window's watch, then SIGTERM
// to SIGKILL. A caller of Settle sizes its deadline with it.
func (d *Daemon) ReclaimTakes() time.Duration {
	return d.reclaimWatch() + d.cfg.ReclaimGrace
}

// inflight counts the reclaims under way; wait returns when there are none.
// (A WaitGroup's Wait may not race with an Add from zero, and a kernel may
// exit, starting a reclaim, at any time.)
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (f *inflight) add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
}

func (f *inflight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 {
		close(f.idle)
		f.idle = nil
	}
}

func (f *inflight) wait(ctx context.Context) error {
	for {
		f.mu.Lock()
		idle := f.idle
		f.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
