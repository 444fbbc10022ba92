package procs

import (
	"errors"

	"golang.org/x/sys/unix"
)

// pidWatch learns of the exit of the processes it watches without reading
// /proc: one pidfd each, all in one epoll set. A pidfd pins the process it
// was opened for (a reused pid is another process), and becomes readable
// when that process exits, zombie or reaped.
type pidWatch struct {
	epfd   int
	budget int               // pidfds it may hold
	fds    map[int]int       // pid → pidfd
	pids   map[int]int       // pidfd → pid
	events []unix.EpollEvent // one per pidfd: every exit in one call
}

// newPidWatch returns a watch of at most a quarter of the descriptors this
// process may open (the daemon needs the rest), or nil where the kernel
// has no pidfds (before Linux 5.3).
func newPidWatch() *pidWatch {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 256 {
		return nil
	}
	fd, err := unix.PidfdOpen(unix.Getpid(), 0)
	if err != nil {
		return nil
	}
	unix.Close(fd)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil
	}
	return &pidWatch{epfd: ep, budget: int(min(lim.Cur/4, 1<<16)), fds: map[int]int{}, pids: map[int]int{}}
}

// watch starts watching pid, if there is room, and then calls same: the
// pidfd is kept only if same reports that pid is still the process meant
// (its start time, read after the pidfd pinned it). It reports whether pid
// is watched.
func (w *pidWatch) watch(pid int, same func() bool) bool {
	if w == nil {
		return false
	}
	if _, ok := w.fds[pid]; ok {
		return true
	}
	if len(w.fds) >= w.budget {
		return false
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return false
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if !same() || unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev) != nil {
		unix.Close(fd)
		return false
	}
	w.fds[pid], w.pids[fd] = fd, pid
	return true
}

// watched reports whether pid is watched.
func (w *pidWatch) watched(pid int) bool {
	if w == nil {
		return false
	}
	_, ok := w.fds[pid]
	return ok
}

// forget stops watching pid.
func (w *pidWatch) forget(pid int) {
	if w == nil {
		return
	}
	fd, ok := w.fds[pid]
	if !ok {
		return
	}
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	unix.Close(fd)
	delete(w.fds, pid)
	delete(w.pids, fd)
}

// exited returns the watched pids whose process has exited, without
// waiting. They stay watched until forgotten.
func (w *pidWatch) exited() ([]int, error) {
	if w == nil {
		return nil, nil
	}
	if len(w.events) < len(w.fds) { // room for all at once
		w.events = make([]unix.EpollEvent, len(w.fds))
	}
	for {
		n, err := unix.EpollWait(w.epfd, w.events, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var out []int
		for _, ev := range w.events[:n] {
			if pid, ok := w.pids[int(ev.Fd)]; ok {
				out = append(out, pid)
			}
		}
		return out, nil
	}
}

// close releases every descriptor.
func (w *pidWatch) close() {
	if w == nil {
		return
	}
	for pid := range w.fds {
		w.forget(pid)
	}
	unix.Close(w.epfd)
}
