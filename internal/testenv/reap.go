package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Reaper kills, in t.Cleanup, what a Server's own cleanup does not: the
// kernels the server started (jupyter_client starts each in a new session,
// outside the server's process group), their process groups, and any pid
// added (say, a kernel's child started with start_new_session=True).
//
// Its cleanup runs before the server's (it is registered later) and kills
// the server's group first, so that the server's restarter cannot replace
// the kernels it kills. It holds a pidfd for each process from the moment it
// learns of it, so a pid reused by another process (another test's, on a
// shared machine) is never signalled.
type Reaper struct {
	srv *Server
	mu  sync.Mutex
	fds map[int]int // pid → pidfd
}

// NewReaper returns a Reaper for srv's kernels (srv may be nil: then only
// added pids are killed).
func NewReaper(t testing.TB, srv *Server) *Reaper {
	r := &Reaper{srv: srv, fds: map[int]int{}}
	t.Cleanup(func() { r.reap(t) })
	return r
}

// Add registers live pids to kill, with the process group each leads.
func (r *Reaper) Add(pids ...int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range pids {
		if _, ok := r.fds[pid]; ok {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // already gone: nothing to kill
		}
		r.fds[pid] = fd
	}
}

func (r *Reaper) reap(t testing.TB) {
	if r.srv != nil {
		if r.srv.Cmd.Process != nil {
			_ = unix.Kill(-r.srv.Cmd.Process.Pid, unix.SIGKILL)
		}
		// Every kernel of this server names a connection file in its
		// runtime dir, which no other test's process can.
		prefix := r.srv.RuntimeDir() + "/kernel-"
		r.Add(ProcessesWithArg(func(argv []string) bool {
			for _, a := range argv {
				if strings.HasPrefix(a, prefix) {
					return true
				}
			}
			return false
		})...)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for pid, fd := range r.fds {
		// While the pidfd's process lives, pid is still its pid, and a group
		// of that id can only be the one it leads.
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err == nil {
			_ = unix.Kill(-pid, unix.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for pid, fd := range r.fds {
		if !waitPidfd(fd, time.Until(deadline)) {
			t.Errorf("reaper: pid %d still alive 10 s after SIGKILL", pid)
		}
		_ = unix.Close(fd)
		delete(r.fds, pid)
	}
}

// waitPidfd waits up to d for the pidfd's process to exit.
func waitPidfd(fd int, d time.Duration) bool {
	ms := max(int(d/time.Millisecond), 0)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

// Pinned is a process held by a pidfd taken while the test knew it to be
// that process: a signal through it reaches that process or nothing, never
// one that took its number after it exited (on a busy host numbers come
// round again within seconds). A test that kills a process it did not
// start, or one that may have ended by itself, pins it first.
type Pinned struct {
	PID int
	fd  int
}

// Pin takes a pidfd of pid now, closed at t's cleanup; the test fails when
// pid is gone already.
func Pin(t testing.TB, pid int) *Pinned {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pin pid %d: %v", pid, err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return &Pinned{PID: pid, fd: fd}
}

// Signal sends sig to the pinned process, and reports whether it still
// ran to receive it.
func (p *Pinned) Signal(sig unix.Signal) bool {
	return unix.PidfdSendSignal(p.fd, sig, nil, 0) == nil
}

// KillIf sends SIGKILL to pid when still(pid) holds for the process that
// has that number now, and reports whether it did. A pidfd pins that
// process before still looks (still reads /proc/<pid>/… by number: what it
// read was the pidfd's process's if that process is still alive after),
// and the signal goes through the pidfd: a process that took the number of
// one that exited is never signalled.
func KillIf(pid int, still func(pid int) bool) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false // gone
	}
	defer unix.Close(fd)
	if !still(pid) || waitPidfd(fd, 0) {
		return false
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}

// killGroup sends SIGKILL to the process group that the process (pid,
// start) leads, or led: a group's id is its leader's pid, and once the
// leader is reaped that number can be reused, by a process that leads a
// group of its own. So the group is signalled unless another process (one
// with another start time) has the number now. (Left: a process that took
// the number, led a group and exited before this look, its group living
// on; that takes two reuses of one number within a test.) start 0 means
// unknown: the group is signalled.
func killGroup(pid int, start uint64) {
	if now, ok := procStart(pid); ok && start != 0 && now != start {
		return
	}
	_ = unix.Kill(-pid, unix.SIGKILL)
}

// procStart is field 22 of /proc/<pid>/stat (clock ticks since boot): with
// the pid it names one process.
func procStart(pid int) (uint64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 { // fields 3 (state) to 22 (starttime)
		return 0, false
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	return start, err == nil
}
