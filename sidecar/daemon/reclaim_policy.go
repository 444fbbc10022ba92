package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// procID identifies a process: pids are reused, (pid, start time) is not.
type procID struct {
	PID   int
	Start uint64
}

// candidate is a process recorded in a dead kernel's tree.
type candidate struct {
	ID    procID
	UID   uint32
	Argv  string
	Bytes uint64 // GPU memory it holds now (all GPUs)
}

// reclaimPolicy decides, purely, which recorded processes of a kernel that
// restarted or shut down may be ended.
type reclaimPolicy struct {
	selfUID   uint32
	allUsers  bool // root with --reclaim-all-users
	keep      map[procID]bool
	gpuHolder func(pid int) (bytes uint64, holds bool)
	// podOf, when set (pod kernels are followed), names the pod UID of a
	// process ("" outside any pod) from its cgroup; pod is the dead
	// kernel's ("" for a kernel of this host). A process counts only in
	// the same pod as the kernel whose tree recorded it: a process in
	// another pod, or outside any, is never ended for it, whatever else
	// it shares with the tree.
	pod   string
	podOf func(id procID) (string, error)
}

// decision is what to do with one recorded process, and why.
type decision struct {
	candidate
	Kill   bool
	Reason string
}

// decide returns a decision for each recorded process that is still alive
// (same pid and start time) in table and holds GPU memory. Processes that
// are gone, were replaced by a reused pid, or hold no GPU memory are left
// out: nothing is done to them and there is nothing to report.
func (p reclaimPolicy) decide(recorded map[procID]recordedProc, table *procs.Table) []decision {
	var out []decision
	for id, rec := range recorded {
		cur, ok := table.Lookup(id.PID, id.Start)
		if !ok {
			continue // exited, or its pid now names another process
		}
		bytes, holds := p.gpuHolder(id.PID)
		if !holds {
			continue
		}
		uid := rec.UID
		if cur.Detailed {
			uid = cur.UID
		}
		d := decision{candidate: candidate{ID: id, UID: uid, Argv: rec.Argv, Bytes: bytes}}
		podReason := p.podMismatch(id)
		switch {
		case p.keep[id]:
			d.Reason = "belongs to a live kernel"
		case podReason != "":
			d.Reason = podReason
		case uid != p.selfUID && !p.allUsers:
			d.Reason = fmt.Sprintf("owned by uid %d, not ours (run as root with --reclaim-all-users to reclaim it)", uid)
		default:
			d.Kill = true
		}
		out = append(out, d)
	}
	return out
}

// podMismatch says why process id is outside the dead kernel's pod, or ""
// when it is inside (or no pod rule applies).
func (p reclaimPolicy) podMismatch(id procID) string {
	if p.podOf == nil {
		return ""
	}
	pod, err := p.podOf(id)
	switch {
	case err != nil:
		return fmt.Sprintf("its pod cannot be read (%v): not proven to be in the kernel's pod", err)
	case pod == p.pod:
		return ""
	case pod == "":
		return fmt.Sprintf("outside any pod, the kernel ran in pod %s", p.pod)
	case p.pod == "":
		return fmt.Sprintf("in pod %s, the kernel ran outside any pod", pod)
	}
	return fmt.Sprintf("in pod %s, not the kernel's pod %s", pod, p.pod)
}

// errStale means the pid no longer names the recorded process.
var errStale = errors.New("pid now names another process")

// terminate ends the process id with SIGTERM, then SIGKILL after grace. It
// holds a pidfd from before checking the start time until the last signal,
// so a pid reused in between can never be signalled. It returns when the
// process has exited or ctx ends.
func terminate(ctx context.Context, proc ProcReader, id procID, grace time.Duration) (killed bool, err error) {
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil // already gone
		}
		return false, fmt.Errorf("pidfd_open %d: %w", id.PID, err)
	}
	defer unix.Close(fd)
	// The pidfd now pins the process the pid named when it was opened; check
	// that this is still the one we recorded.
	gone, err := proc.Exited(id.PID, id.Start)
	if err != nil {
		return false, err
	}
	if gone {
		return false, errStale
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		if errors.Is(err, unix.EPERM) {
			return false, fmt.Errorf("SIGTERM %d: %w (another user's process: the daemon needs root or CAP_KILL)", id.PID, err)
		}
		return false, fmt.Errorf("SIGTERM %d: %w", id.PID, err)
	}
	if exited(ctx, fd, grace) {
		return false, nil
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return false, fmt.Errorf("SIGKILL %d: %w", id.PID, err)
	}
	exited(ctx, fd, 5*time.Second)
	return true, nil
}

// exited waits up to d for the pidfd to become readable (the process exited).
func exited(ctx context.Context, fd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return false
		}
		// Wake at least every 100ms to notice ctx.
		wait := min(left, 100*time.Millisecond)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(wait/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if n > 0 {
			return true
		}
	}
}
