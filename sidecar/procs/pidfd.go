package procs

import (
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
)

// OpenPID opens <root>/<pid> as a directory after checking, through that
// very descriptor, that the process started at startTime. The descriptor
// stays bound to that process: once it exits, names under it (root,
// ns/net, fd) fail with ESRCH instead of reaching a process that reused the
// pid. startTime 0 skips the check. The caller closes the descriptor.
func (fs *FS) OpenPID(pid int, startTime uint64) (int, error) {
	dirfd, err := syscall.Open(filepath.Join(fs.root(), strconv.Itoa(pid)), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("pid %d: %w", pid, err)
	}
	if startTime == 0 {
		return dirfd, nil
	}
	buf, err := readAt(dirfd, "stat", make([]byte, 0, 1024))
	if err == nil {
		var st statFields
		if st, err = parseStat(buf); err == nil && st.StartTime != startTime {
			err = fmt.Errorf("started at tick %d, not %d: the pid was reused: %w", st.StartTime, startTime, syscall.ESRCH)
		}
	}
	if err != nil {
		syscall.Close(dirfd)
		return -1, fmt.Errorf("pid %d: %w", pid, err)
	}
	return dirfd, nil
}
