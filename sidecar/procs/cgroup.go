package procs

import (
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
)

// Cgroup reads /proc/<pid>/cgroup of the process (pid, startTime) under
// the FS's root and returns its raw content; package cgroups parses it.
// The process's start time is checked through the same directory
// descriptor, so a pid reused by another process since the scan gives an
// error wrapping syscall.ESRCH instead of another process's cgroup.
// startTime 0 skips that check.
func (fs *FS) Cgroup(pid int, startTime uint64) ([]byte, error) {
	dirfd, err := syscall.Open(filepath.Join(fs.root(), strconv.Itoa(pid)), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	defer syscall.Close(dirfd)
	buf := make([]byte, 0, 1024)
	if startTime != 0 {
		buf, err = readAt(dirfd, "stat", buf)
		if err != nil {
			return nil, fmt.Errorf("read cgroup of pid %d: %w", pid, err)
		}
		st, err := parseStat(buf)
		if err != nil {
			return nil, fmt.Errorf("read cgroup of pid %d: %w", pid, err)
		}
		if st.StartTime != startTime {
			return nil, fmt.Errorf("read cgroup of pid %d: started at tick %d, not %d: the pid was reused: %w", pid, st.StartTime, startTime, syscall.ESRCH)
		}
	}
	data, err := readAt(dirfd, "cgroup", buf[:0])
	if err != nil {
		return nil, fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	return append([]byte(nil), data...), nil
}
