package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// The one place the daemon signals a process: reclaim's survivors, the
// processes left running ended on request and free --children's workers
// all end through endProcess, each after reclaim's policy (reclaim_policy.go,
// pure) decided it may.

// endOutcome is what ending one process came to.
type endOutcome struct {
	ended  bool // it exited (or was already gone)
	killed bool // it ignored SIGTERM for the grace and got SIGKILL
	stale  bool // its pid names another process now: left alone
	err    error
}

// endProcess ends the process id (SIGTERM, SIGKILL after the reclaim
// grace) while its pid still names the process recorded with id's start
// time: Deps.Terminate, through a pidfd.
func (d *Daemon) endProcess(ctx context.Context, id procID) endOutcome {
	killed, err := d.deps.Terminate(ctx, id.PID, id.Start, d.cfg.ReclaimGrace)
	switch {
	case errors.Is(err, errStale):
		return endOutcome{stale: true}
	case err != nil:
		return endOutcome{err: err}
	}
	return endOutcome{ended: true, killed: killed}
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
