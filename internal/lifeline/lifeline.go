// Package lifeline tells a daemon that the process which started it (a
// Jupyter server) is gone, and lets it wait for that process's other
// children (the server's kernels) to end. Two signs, because either alone
// can miss: the parent-death signal (prctl PR_SET_PDEATHSIG), at once, and
// a check every second that getppid is still the parent (the signal is tied
// to the thread that forked; a process re-parented to a subreaper gets
// none).
//
// It watches only; what to do when the parent goes is the caller's.
package lifeline

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// deathSignal is the parent-death signal: caught here, it only wakes the
// check. Before the handler is in place it ends the process, which is what
// an orphaned daemon should do anyway.
const deathSignal = unix.SIGHUP

// Options say whom to watch.
type Options struct {
	// Parent is the pid of this process's parent: the process to outlive
	// by no more than the caller's cleanup.
	Parent int
	// Every is how often the parent is checked and its children listed
	// (default 1 s).
	Every time.Duration
	// Children lists the parent's children now (sidecar/procs's
	// ChildrenOf); nil: none are followed.
	Children func(parent int) ([]int, error)
}

// Watch follows one parent. Its goroutine ends when the parent is gone or
// ctx ends; Close waits for it and releases what it holds.
type Watch struct {
	opts Options
	gone chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	children map[int]int // pid → pidfd: the parent's children seen, but this process
}

// Start begins watching. It fails when parent is not this process's
// parent (already gone, or a wrong pid): the caller should not start.
func Start(ctx context.Context, opts Options) (*Watch, error) {
	if opts.Every <= 0 {
		opts.Every = time.Second
	}
	if ppid := os.Getppid(); ppid != opts.Parent {
		return nil, fmt.Errorf("process %d is not this process's parent (its parent is %d): it has exited, or the pid is wrong", opts.Parent, ppid)
	}
	w := &Watch{opts: opts, gone: make(chan struct{}), children: map[int]int{}}
	started := make(chan error, 1)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.run(ctx, started)
	}()
	if err := <-started; err != nil {
		w.wg.Wait()
		return nil, err
	}
	return w, nil
}

// Gone is closed once the parent has exited.
func (w *Watch) Gone() <-chan struct{} { return w.gone }

func (w *Watch) run(ctx context.Context, started chan<- error) {
	// The death signal belongs to the thread that set it: keep this
	// goroutine on one thread while it is set, and clear it before letting
	// the thread go.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, deathSignal)
	defer signal.Stop(sig)
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(deathSignal), 0, 0, 0); err != nil {
		started <- fmt.Errorf("set the parent-death signal: %w", err)
		return
	}
	defer func() { _ = unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0) }()
	started <- nil
	tick := time.NewTicker(w.opts.Every)
	defer tick.Stop()
	for {
		// Checked after setting the signal: a parent that died before it
		// was set is seen here.
		if os.Getppid() != w.opts.Parent {
			close(w.gone)
			return
		}
		w.followChildren()
		select {
		case <-ctx.Done():
			return
		case <-sig:
		case <-tick.C:
		}
	}
}

// followChildren opens a pidfd on each new child of the parent (so that
// waiting later cannot mistake a reused pid for it) and drops those that
// left the list (exited).
func (w *Watch) followChildren() {
	if w.opts.Children == nil {
		return
	}
	now, err := w.opts.Children(w.opts.Parent)
	if err != nil {
		return // the parent is going: the next check says so
	}
	self := os.Getpid()
	w.mu.Lock()
	defer w.mu.Unlock()
	for pid, fd := range w.children {
		if !slices.Contains(now, pid) {
			unix.Close(fd)
			delete(w.children, pid)
		}
	}
	var opened []int
	for _, pid := range now {
		if _, ok := w.children[pid]; ok || pid == self {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // exited meanwhile
		}
		w.children[pid] = fd
		opened = append(opened, pid)
	}
	if len(opened) == 0 {
		return
	}
	// A pid listed, then reused before its pidfd was opened, is no
	// longer the parent's child: keep only those still listed.
	again, err := w.opts.Children(w.opts.Parent)
	if err != nil {
		return
	}
	for _, pid := range opened {
		if !slices.Contains(again, pid) {
			unix.Close(w.children[pid])
			delete(w.children, pid)
		}
	}
}

// WaitChildren waits, after Gone, until every child of the parent that
// the watch saw is gone (exited and reaped: a zombie still shows in /proc,
// where the caller looks next), or ctx ends; it returns the pids still
// there then, sorted.
func (w *Watch) WaitChildren(ctx context.Context) []int {
	w.mu.Lock()
	waiting := map[int]int{} // pid → pidfd
	for pid, fd := range w.children {
		waiting[pid] = fd
	}
	w.mu.Unlock()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		for pid, fd := range waiting {
			// Signal 0 through the pidfd: ESRCH once the process is
			// reaped, whatever process has its pid by then.
			if err := unix.PidfdSendSignal(fd, 0, nil, 0); err == unix.ESRCH {
				delete(waiting, pid)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			left := make([]int, 0, len(waiting))
			for pid := range waiting {
				left = append(left, pid)
			}
			slices.Sort(left)
			return left
		case <-tick.C:
		}
	}
}

// Close waits for the watch's goroutine (its ctx must have ended or the
// parent gone) and closes the pidfds.
func (w *Watch) Close() {
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for pid, fd := range w.children {
		unix.Close(fd)
		delete(w.children, pid)
	}
}

// Following lists the parent's children the watch follows now, sorted.
func (w *Watch) Following() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int, 0, len(w.children))
	for pid := range w.children {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}
